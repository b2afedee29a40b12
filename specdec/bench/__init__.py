"""One benchmark command: `python -m specdec.bench <subcommand> [options]`.

Each subcommand is a module here with a frozen `Config` dataclass (its options),
`run(config) -> dict` (the measurement, JSON-serializable; what the tests call) and
`render(result) -> str` (the Markdown it prints). `docs/benchmarks.md` says which
command measures what, against which of the paper's tables (Leviathan, Kalman &
Matias, ICML 2023).
"""

# subcommand -> (module, one line of what it measures); modules are imported only
# when their subcommand runs (compare-hf needs torch, the others do not).
SUBCOMMANDS = {
  "tables": (
    "specdec.bench.tables",
    "Tables 2-4 for a pair: alpha, c, v, Eq. 1, predicted and measured speed-up over a gamma sweep",
  ),
  "costs": (
    "specdec.bench.costs",
    "step costs t(k), c, v(k) and the roofline (weight bytes over the streaming rate)",
  ),
  "loop": (
    "specdec.bench.loop",
    "the decode loop against the parts Theorem 3.8 counts (target chunk, draft steps, overhead)",
  ),
  "identity": (
    "specdec.bench.identity",
    "greedy speculative decoding vs the greedy baseline, token for token, and why rows differ",
  ),
  "lenience": (
    "specdec.bench.lenience",
    "Table 5: lenient acceptance (A.5), alpha_l, speed-up and quality",
  ),
  "compare-hf": (
    "specdec.bench.compare_hf",
    "specdec against transformers' assisted generation on the same pair and CPU",
  ),
  "adaptive": (
    "specdec.bench.adaptive",
    "baseline, each fixed gamma and AutoGamma side by side, per pair, temperature and batch size",
  ),
  "demo": (
    "specdec.bench.demo",
    "the paper's Table 2 in shape: EnDe, CNN/DM and Chat "
    "on the shipped pairs, fixed gamma and AutoGamma against the baseline",
  ),
  "sampler": (
    "specdec.bench.sampler",
    "the sampler's own per-iteration cost with nearly free lookup-table models",
  ),
}
