"""Synthetic data: Zipf ids, per-feature pooling factors, lengths that vary per batch, labels."""

from __future__ import annotations

import torch

from models import data, presets, sparse


def _batches(**overrides: object) -> tuple[dict, sparse.SparseLayout, list]:
    cfg = presets.resolve("towers", "small", overrides)
    lay = sparse.layout(cfg)
    return cfg, lay, data.make_batches(cfg, lay, seed=0, device=torch.device("cpu"))


def test_ids_in_range_and_zipf_skewed() -> None:
    _, lay, batches = _batches()
    ids = torch.cat([b.inputs[1].values() for b in batches])
    assert int(ids.min()) >= 0 and int(ids.max()) < lay.rows_per_table
    # Per feature, the hottest 1% of rows draw far more than 1% of the lookups.
    kjt = batches[0].inputs[1]
    hot_shares = []
    for key in lay.feature_names:
        values = kjt[key].values()
        counts = torch.bincount(values, minlength=lay.rows_per_table).sort(descending=True).values
        hot_shares.append(float(counts[: lay.rows_per_table // 100].sum()) / max(1, values.numel()))
    assert sum(hot_shares) / len(hot_shares) > 0.2, hot_shares


def test_uniform_when_alpha_zero() -> None:
    cdf = data.zipf_cdf(1000, 0.0)
    torch.testing.assert_close(cdf[499], torch.tensor(0.5, dtype=torch.float64))


def test_pooling_factors_differ_per_feature_and_lengths_vary_per_batch() -> None:
    cfg, lay, batches = _batches()
    b = cfg["batch_size"]
    lengths = torch.stack([bt.inputs[1].lengths().view(lay.num_features, b).float() for bt in batches])
    per_feature_mean = lengths.mean(dim=(0, 2))
    assert float(per_feature_mean.max()) > 2 * float(per_feature_mean.min()), per_feature_mean
    assert abs(float(per_feature_mean.mean()) - cfg["pooling_mean"]) < 0.35 * cfg["pooling_mean"]
    assert int(lengths.max()) <= cfg["max_pooling"]
    totals = [int(bt.inputs[1].values().numel()) for bt in batches]
    assert len(set(totals)) > 1, "total KJT lengths must vary from batch to batch"


def test_zero_spread_gives_equal_feature_means() -> None:
    gen = torch.Generator().manual_seed(0)
    cfg = presets.resolve("dlrm", "tiny", {"pooling_spread": 0.0})
    means = data.feature_pooling_means(cfg, 5, gen)
    torch.testing.assert_close(means, torch.full((5,), cfg["pooling_mean"], dtype=torch.float64))


def test_labels_depend_on_dense_features() -> None:
    _, _, batches = _batches(batch_size=2048, num_batches=1)
    dense, labels = batches[0].inputs[0], batches[0].labels
    rate = labels.mean(0)
    assert bool(((rate > 0.02) & (rate < 0.98)).all()), rate
    # The teacher makes labels correlate with some dense feature well above noise.
    centred = dense - dense.mean(0)
    corr = (centred.T @ (labels - rate)) / len(labels)
    assert float(corr.abs().max()) > 0.05


def test_labels_depend_on_sparse_ids() -> None:
    """The teacher scores the ids too: the labels follow its sparse half, and the half is a fixed
    function of (seed, feature, id), not of the batch it is drawn in."""
    cfg, lay, batches = _batches(batch_size=2048, num_batches=1)
    kjt, labels = batches[0].inputs[1], batches[0].labels
    lengths, values = kjt.lengths().long(), kjt.values()
    score = data.sparse_teacher_score(values, lengths, lay.num_features, int(cfg["num_tasks"]), seed=0)
    assert score.shape == labels.shape
    assert float(score.std()) > 0.5  # as strong a signal as the dense half's (standard deviation 1)
    for t in range(labels.shape[1]):
        pos, neg = score[labels[:, t] == 1, t], score[labels[:, t] == 0, t]
        assert float(pos.mean() - neg.mean()) > 0.3, t
    other_seed = data.sparse_teacher_score(values, lengths, lay.num_features, int(cfg["num_tasks"]), seed=1)
    assert not torch.allclose(score, other_seed)
    # A sample without ids adds nothing to its score.
    one = data.sparse_teacher_score(values[:0], torch.zeros_like(lengths), lay.num_features, 2, seed=0)
    assert torch.equal(one, torch.zeros_like(one))
