"""Alias of `specdec.bench.measure` (step costs, decode timings, alpha), kept for the
name's existing users; new code imports `specdec.bench.measure`."""

from specdec.bench.measure import *  # noqa: F401,F403
from specdec.bench.measure import (_extend_repeated, _FeatureStep,  # noqa: F401
                                   _teacher_forced_betas, _wall_times)
from specdec.bench.cli import write_json  # noqa: F401
