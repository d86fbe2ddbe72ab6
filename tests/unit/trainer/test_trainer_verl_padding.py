"""verl's dispatch splits a batch into one equal chunk per data-parallel rank: the verl backend pads the
rows with masked-out copies (``trainer.backends.verl_convert.pad_rows``), which carry no loss."""

from __future__ import annotations

import pytest

from trainer.backends.verl_convert import pad_rows, to_verl_batch
from trainer.batching import Sample

pytestmark = pytest.mark.timeout(30)


def _samples(n: int) -> list[Sample]:
    return [Sample([1, 2], [3 + i, 4], [1, 1], [-1.0, -2.0], 1.0, 0.5, f"e{i}") for i in range(n)]


@pytest.mark.parametrize(("rows", "ranks", "padded"), [(4, 2, 4), (3, 2, 4), (5, 4, 8), (1, 3, 3), (3, 1, 3)])
def test_rows_are_padded_to_a_multiple_of_the_ranks(rows: int, ranks: int, padded: int) -> None:
    samples = _samples(rows)
    out = pad_rows(samples, ranks)
    assert len(out) == padded
    assert out[:rows] == samples
    for filler in out[rows:]:
        assert filler.response_tokens == 0 and filler.token_weight == 0.0
        assert filler.response_ids == samples[0].response_ids  # a real row for the forward pass


def test_a_padding_row_is_outside_the_loss() -> None:
    batch = to_verl_batch(pad_rows(_samples(3), 2), pad_id=0)
    assert batch.rows == 4
    assert int(batch.tensors["response_mask"][3].sum()) == 0
    assert float(batch.tensors["advantages"][3].abs().sum()) == 0.0
    assert int(batch.tensors["attention_mask"][3].sum()) == 4  # the model still sees it
