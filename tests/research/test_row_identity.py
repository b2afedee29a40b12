"""scripts/research/row_identity.py: each row alone against the same row in batches."""

import numpy as np
import pytest
import row_identity

from specdec.bench import workloads

pytestmark = pytest.mark.research


def test_a_toy_pairs_rows_are_counted_alone_and_in_batches(monkeypatch):
  work = workloads.load("toy_llama", 4, draft="d")
  inputs = np.asarray(work.inputs)
  report = row_identity.identity_rates(
    work.target, work.drafts["d"], inputs, work.eos_id, [2, 4], 5, 2
  )
  assert set(report) == {"autoregressive", "speculative_gamma2"}
  for entry in report.values():
    assert len(entry["alone_lengths"]) == 4
    for batch in ("2", "4"):
      assert entry[batch]["rows"] == 4
      assert entry[batch]["identical"] + len(entry[batch]["differing"]) == 4
  # A row that differs is reported: the batch-4 decode of row 3 is made to differ.
  real = row_identity.decode_rows

  def shifted(decode, x, batch):
    rows = real(decode, x, batch)
    return rows[:3] + [rows[3] + 1] if batch == 4 else rows

  monkeypatch.setattr(row_identity, "decode_rows", shifted)
  report = row_identity.identity_rates(
    work.target, work.drafts["d"], inputs, work.eos_id, [4], 5, 2
  )
  assert report["autoregressive"]["4"]["differing"] == [3]
  assert report["autoregressive"]["4"]["rate"] == 0.75
  table = row_identity.table([{"pair": "toy_llama", "decoders": report}], [4])
  assert "| toy_llama | autoregressive | 3/4 |" in table
