"""The papers' experiment harness (python/experiments, docs/papers.md) at the tiny budget: the
task generators follow their definitions, the GLR slots read from the library are the paper's
offsets, every family's layer runs forward and backward, a trivial task trains, Kendall τ and the
table are right on hand-computed inputs, and one command writes its logs and table."""

import dataclasses
import json
import math
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

# `experiments` lives next to the package sources in python/; appended, so the installed `mixers`
# (with its compiled extension) stays first on the path.
sys.path.append(os.path.join(os.path.dirname(__file__), ".."))

from experiments import report, runner, settings  # noqa: E402
from experiments.model import MixerLayer, Model, glr_sources  # noqa: E402
from experiments.tasks import IGNORE, Split, TaskConfig, TrainStream, generate, token_hash  # noqa: E402
from experiments.train import GRAPH_AFTER, RunConfig, Trainer, evaluate, lr_at, train, train_many  # noqa: E402


def test_copy_layout():
    c = TaskConfig("copy", alphabet=5, min_len=3, max_len=6)
    tok, tgt, _ = generate(c, 50, np.random.default_rng(0))
    assert tok.shape == (50, 14)
    for row, y in zip(tok, tgt):
        n = int(np.where(row == 6)[0][0]) - 1  # `|` is id A + 1
        assert row[0] == 5 and 3 <= n <= 6
        assert (row[1 : n + 1] == row[n + 2 : 2 * n + 2]).all()
        labelled = np.where(y != IGNORE)[0].tolist()
        assert labelled == list(range(n + 1, 2 * n + 2))
        assert (y[n + 1 : 2 * n + 1] == row[1 : n + 1]).all() and y[2 * n + 1] == 7  # then `.`


def test_mqar_queries_recall_distinct_values():
    c = TaskConfig("mqar", vocab=64, pairs=8, seq_len=48)
    tok, tgt, _ = generate(c, 20, np.random.default_rng(1))
    for row, y in zip(tok, tgt):
        keys, vals = row[0:16:2], row[1:16:2]
        assert len(set(keys)) == 8 and len(set(vals)) == 8
        assert ((1 <= keys) & (keys < 32)).all() and ((32 <= vals) & (vals < 64)).all()
        kv = dict(zip(keys.tolist(), vals.tolist()))
        q = np.where(y != IGNORE)[0]
        assert len(q) == 8 and (q >= 16).all() and ((q - 16) % 2 == 0).all()
        for p in q:
            assert kv[row[p]] == y[p] == row[p + 1]


def test_multihop_follows_chains():
    c = TaskConfig("multihop", vocab=30, pairs=10, max_hops=3, queries=3)
    tok, tgt, grp = generate(c, 30, np.random.default_rng(2))
    for row, y, g in zip(tok, tgt, grp):
        assert row[20] == 29
        nxt = dict(zip(row[0:20:2].tolist(), row[1:20:2].tolist()))
        assert len(nxt) == 10
        for p in range(21, 24):
            x, hops = row[p], 0
            while x in nxt:
                x, hops = nxt[x], hops + 1
            assert x == y[p] and hops == g[p] + 1


def test_mqar_first_query_slot_follows_the_power_law():
    """The query slots are drawn one after another without replacement with probability
    ∝ (j+1)^(a−1): the first key's slot follows that law (total variation against it)."""
    c = TaskConfig("mqar", vocab=16, pairs=2, seq_len=16, power_a=0.3)
    tok, tgt, _ = generate(c, 40000, np.random.default_rng(3))
    first_key = tok[:, 0]
    slot = np.argmax((tok == first_key[:, None]) & (np.arange(16) >= 4)[None, :], axis=1)
    j = (slot - 4) // 2
    space = (16 - 4) // 2
    law = np.arange(1, space + 1) ** (0.3 - 1.0)
    law /= law.sum()
    got = np.bincount(j, minlength=space) / len(j)
    assert 0.5 * np.abs(got - law).sum() < 0.01, (got, law)


@pytest.mark.parametrize("lo,hi,d", [(3, 20, 5), (1, 400, 12)])  # the permutation path, the draws path
def test_distinct_draws_are_uniform_without_replacement(lo, hi, d):
    from experiments.tasks import _distinct
    x = _distinct(np.random.default_rng(6), 30000, lo, hi, d)
    assert x.shape == (30000, d) and x.min() >= lo and x.max() < hi
    assert all(len(set(r.tolist())) == d for r in x[:2000])
    for col in (0, d - 1):  # every position's value is uniform on the range
        got = np.bincount(x[:, col] - lo, minlength=hi - lo) / len(x)
        assert 0.5 * np.abs(got - 1.0 / (hi - lo)).sum() < 0.06, (col, got)


def test_multihop_hops_are_uniform():
    """The queried chains' hop counts are uniform in 1..max_hops; the context holds `pairs`
    distinct pairs of distinct symbols."""
    c = TaskConfig("multihop", vocab=64, pairs=24, max_hops=4, queries=4)
    tok, tgt, grp = generate(c, 20000, np.random.default_rng(4))
    counts = np.bincount(grp[:, 49:53].ravel(), minlength=4) / grp[:, 49:53].size
    assert np.abs(counts - 0.25).max() < 0.01, counts
    firsts = tok[:, 0:48:2]
    assert all(len(set(r.tolist())) == 24 for r in firsts[:200])


def _fnv_mix(row):
    """The split hash of one row with Python integers mod 2⁶⁴ (FNV-1a, then the final mix)."""
    m = (1 << 64) - 1
    h = 0xCBF29CE484222325
    for t in row:
        h = ((h ^ int(t)) * 0x100000001B3) & m
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & m
    return h ^ (h >> 33)


def test_seeds_and_disjoint_splits():
    c = TaskConfig("copy", alphabet=4, min_len=1, max_len=4)
    a, b = generate(c, 40, np.random.default_rng(5)), generate(c, 40, np.random.default_rng(5))
    assert all((x == y).all() for x, y in zip(a, b))
    assert token_hash(a[0]).tolist() == [_fnv_mix(r) for r in a[0]]
    val, test = Split(c, 20, seed=1, which="val"), Split(c, 20, seed=2, which="test")
    train_rows = {r.tobytes() for _ in range(5) for r in TrainStream(c, 64, seed=0, pool=0).next()[0]}
    val_rows, test_rows = {r.tobytes() for r in val.tokens}, {r.tobytes() for r in test.tokens}
    assert len(train_rows) > 4 and val_rows and test_rows
    assert not (train_rows & val_rows) and not (train_rows & test_rows) and not (val_rows & test_rows)
    with pytest.raises(ValueError, match="too few distinct examples"):
        Split(TaskConfig("copy", alphabet=1, min_len=1, max_len=1), 4, seed=0, which="test")


def test_bad_settings_are_errors():
    with pytest.raises(ValueError, match="seq_len must be ≥ 4·pairs = 32, got 20"):
        TaskConfig("mqar", vocab=64, pairs=8, seq_len=20).validate()
    with pytest.raises(ValueError, match="unknown task"):
        TaskConfig("sort").validate()
    with pytest.raises(ValueError, match="no training layer"):
        Model("log-distance-mamba2", {}, vocab=8, seq=8)


@pytest.mark.parametrize("name,config,t,expected", [
    # f(k) = 2^k: token 13 reads 13 − 1, 13 − 2, 13 − 4, 13 − 8.
    ("glr", {"pattern": "pow2"}, 13, [12, 11, 9, 5]),
    # f(k) = k² + 1: 13 − 1, 13 − 2, 13 − 5, 13 − 10.
    ("glr", {"pattern": "sq1"}, 13, [12, 11, 8, 3]),
    ("kth-order", {"order": 3}, 13, [12, 11, 10]),
    ("diagonal-ssm", {}, 13, [12]),
])
def test_glr_sources_are_the_patterns_offsets(name, config, t, expected):
    src = glr_sources(name, json.dumps(config, sort_keys=True), 20)
    assert [s for s in src[t].tolist() if s >= 0] == expected
    assert (src[0] == -1).all()


@pytest.mark.parametrize("name,config", [("glr", {"pattern": "pow2"}), ("dense-recurrence", {})])
def test_glr_slot_scores_are_each_slots_key(name, config):
    """The GLR layer's slot scores equal q_t · k_src(t, j) formed slot by slot, forward and backward."""
    layer = MixerLayer(name, config, width=8, heads=2, seq=13, layers=1).double()
    q, k = (torch.randn(3, 13, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    got = layer.slot_scores(q, k)
    want = torch.einsum("bthd,btjhd->btjh", q, k[:, layer.src])
    assert got.shape == want.shape == (3, 13, layer.src.shape[1], 2)
    assert torch.allclose(got, want, atol=1e-12)
    w = torch.randn_like(got)
    g1 = torch.autograd.grad((got * w).sum(), (q, k))
    g2 = torch.autograd.grad((want * w).sum(), (q, k))
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(g1, g2))


ALL_ROWS = settings.TABLE1_ROWS + settings.MQAR_ROWS + [settings.TOEPLITZ_ROWS[1]]


@pytest.mark.parametrize("row", ALL_ROWS, ids=lambda r: r.label)
def test_every_layer_runs_forward_and_backward(row):
    model = Model(row.mixer, row.config, vocab=9, seq=11, width=8, layers=1, heads=2)
    logits = model(torch.randint(0, 9, (2, 11)))
    assert logits.shape == (2, 11, 9) and torch.isfinite(logits).all()
    logits.square().mean().backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n


@pytest.mark.parametrize("mixer", ["attention", "mamba2", "glr"])
def test_the_short_convolution_is_causal_and_gets_gradients(mixer):
    torch.manual_seed(0)
    model = Model(mixer, {}, vocab=9, seq=12, width=8, layers=2, heads=2, conv=3).double()
    tok = torch.randint(0, 9, (2, 12))
    other = tok.clone()
    other[:, 7] = (tok[:, 7] + 1) % 9
    a, b = model(tok), model(other)
    assert torch.equal(a[:, :7], b[:, :7])  # no position before 7 sees token 7
    assert not torch.allclose(a[:, 7:], b[:, 7:])
    a.square().mean().backward()
    convs = [blk.mix.conv for blk in model.blocks]
    assert all(c.weight.shape == (8, 1, 3) and c.weight.grad.abs().sum() > 0 for c in convs)


def test_lr_schedule():
    cfg = RunConfig(task=TaskConfig(), mixer="attention", steps=100, lr=1.0, warmup=0.05, min_lr=0.1)
    assert lr_at(cfg, 0) == pytest.approx(0.2) and lr_at(cfg, 4) == pytest.approx(1.0)
    assert lr_at(cfg, 99) == pytest.approx(0.1)


def test_a_trivial_copy_trains():
    torch.set_num_threads(1)  # a shared machine: more threads only wait for each other
    cfg = RunConfig(task=TaskConfig("copy", alphabet=8, min_len=2, max_len=2), mixer="attention", width=16,
                    layers=1, steps=60, batch=16, val_size=32, test_size=32, eval_every=20, lr=1e-2)
    log = train(cfg)
    loss = log["curve"]["loss"]
    assert np.mean(loss[-10:]) < 0.5 * np.mean(loss[:10]), loss
    assert log["test"]["accuracy"] > 0.6  # chance: 1/8 over the vocabulary
    assert json.loads(json.dumps(log))["config"]["task"]["max_len"] == 2


def test_kendall_tau_on_hand_computed_rankings():
    # Pairs of [1,2,3,4] vs [1,3,2,4]: 5 concordant, 1 discordant → (5 − 1)/6.
    assert report.kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    # Ties: a = [1,1,2,3], b = [1,2,2,3]: C = 4, D = 0, one pair tied in a only, one in b only
    # → 4/√(5·5).
    assert report.kendall_tau([1, 1, 2, 3], [1, 2, 2, 3]) == pytest.approx(0.8)
    assert report.kendall_tau([3, 2, 1], [10, 20, 30]) == pytest.approx(-1.0)
    assert report.kendall_tau([1], [1]) is None
    assert report.kendall_tau([2, 2], [1, 3]) is None


def _log(lr, seed, val, test):
    return {"config": {"lr": lr}, "seed": seed, "wall_s": 1.0, "curve": {"eval_step": [1], "val_accuracy": [val]},
            "val": {"accuracy": val}, "test": {"accuracy": test, "sequence_accuracy": test}}


def test_cell_picks_the_lr_by_validation_and_the_table_reports_tau():
    runs = [_log(1e-3, 0, 0.5, 0.9), _log(1e-3, 1, 0.5, 0.9), _log(1e-2, 0, 0.8, 0.6), _log(1e-2, 1, 0.8, 0.8)]
    c = report.cell(runs)
    assert c["lr"] == 1e-2 and c["mean"] == pytest.approx(70.0)
    assert c["std"] == pytest.approx(100 * math.sqrt(0.02))
    rows = [settings.Row(f"r{i}", "attention", {}, {"copy": p}) for i, p in enumerate([10.0, 30.0, 20.0, 40.0])]
    cells = {(f"r{i}", "copy"): report.cell([_log(1e-3, 0, 0.5, a)]) for i, a in enumerate([0.1, 0.2, 0.3, 0.4])}
    md = report.markdown("t", rows, ["copy"], cells)
    assert "- copy: Kendall τ against the paper: 0.67" in md  # ours 1,2,3,4 vs the paper's 1,3,2,4
    assert "| r2 | `attention` | 30.0 ± 0.0 (lr 0.001) | 20.00 | 1 |" in md


def test_one_command_writes_logs_and_table(tmp_path):
    argv = ["--budget", "tiny", "--steps", "4", "--out", str(tmp_path), "--quiet", "--only", "attention,toeplitz",
            "--threads", "1"]
    res = runner.main("toeplitz_copy", "t", argv)
    root = tmp_path / "toeplitz_copy"
    logs = sorted(p.relative_to(root).as_posix() for p in root.glob("runs/*/*/*.json"))
    assert logs == ["runs/attention/copy/lr0.01-seed0.json", "runs/toeplitz/copy/lr0.01-seed0.json"]
    log = json.loads((root / logs[0]).read_text())
    assert log["seed"] == 0 and len(log["curve"]["loss"]) == 4 and "wall_s" in log
    assert (root / "table.md").read_text().count("\n| ") == 3
    assert len(res["cells"]) == 2
    again = runner.main("toeplitz_copy", "t", argv + ["--resume"])
    assert again["cells"] == res["cells"]


def test_the_positions_scale_reaches_the_model_and_the_log(tmp_path):
    # The model draws its positions at `pos_std` (0: none at all, so the output cannot depend on
    # a token's position when every token is the same).
    flat = Model("attention", {}, vocab=5, seq=7, width=8, layers=1, heads=2, pos_std=0.0)
    assert torch.count_nonzero(flat.pos.weight) == 0
    drawn = Model("attention", {}, vocab=5, seq=4000, width=8, layers=1, heads=2, pos_std=0.5)
    assert abs(drawn.pos.weight.std().item() - 0.5) < 0.02
    argv = ["--budget", "tiny", "--steps", "2", "--out", str(tmp_path), "--quiet", "--only", "attention",
            "--threads", "1", "--pos-std", "0.25"]
    runner.main("toeplitz_copy", "t", argv)
    (log,) = [json.loads(p.read_text()) for p in (tmp_path / "toeplitz_copy").glob("runs/*/*/*.json")]
    assert log["config"]["pos_std"] == 0.25
    assert RunConfig.from_dict(log["config"]).pos_std == 0.25
    with pytest.raises(SystemExit, match="--pos-std"):
        runner.main("toeplitz_copy", "t", argv[:-1] + ["-1"])


def test_runs_in_parallel_processes_give_the_logs_of_one_process(tmp_path):
    argv = ["--budget", "tiny", "--steps", "6", "--quiet", "--only", "attention,toeplitz", "--threads", "1",
            "--seeds", "0", "1"]
    one = runner.main("toeplitz_copy", "t", argv + ["--out", str(tmp_path / "one")])
    two = runner.main("toeplitz_copy", "t", argv + ["--out", str(tmp_path / "two"), "--jobs", "3"])
    logs = sorted(p.relative_to(tmp_path / "one").as_posix() for p in (tmp_path / "one").glob("*/runs/*/*/*.json"))
    assert len(logs) == 4
    for rel in logs:
        a, b = (json.loads((tmp_path / side / rel).read_text()) for side in ("one", "two"))
        assert a["config"] == b["config"] and a["curve"]["loss"] == b["curve"]["loss"]
        assert a["test"] == b["test"] and a["val"] == b["val"]
    strip = lambda cells: [{k: v for k, v in c.items() if k != "wall_s"} for c in cells]  # noqa: E731
    assert strip(one["cells"]) == strip(two["cells"])
    # Two runs per process (a step of each in turn), in two processes: the same logs again.
    three = runner.main("toeplitz_copy", "t", argv + ["--out", str(tmp_path / "three"), "--jobs", "2", "--streams", "2"])
    for rel in logs:
        a, c = (json.loads((tmp_path / side / rel).read_text()) for side in ("one", "three"))
        assert a["curve"]["loss"] == c["curve"]["loss"] and a["test"] == c["test"]
    assert strip(one["cells"]) == strip(three["cells"])


def _shared_process_runs(device):
    """Three runs (two mixers, two seeds and learning rates, one shorter) for train_many."""
    base = dict(task=TaskConfig("mqar", vocab=16, pairs=2, seq_len=12), width=16, layers=1, heads=2, steps=8,
                batch=8, val_size=32, test_size=32, eval_every=3)
    return [RunConfig(mixer="attention", seed=0, **base), RunConfig(mixer="mamba2", seed=1, lr=1e-2, **base),
            RunConfig(mixer="attention", seed=2, **{**base, "steps": 5})]


def test_runs_sharing_a_process_give_the_logs_of_runs_alone():
    cfgs = _shared_process_runs("cpu")
    alone = [train(c) for c in cfgs]
    shared = train_many(cfgs)
    assert len(shared) == 3
    for a, b in zip(alone, shared):
        assert a["config"] == b["config"] and a["curve"] == b["curve"]
        assert a["val"] == b["val"] and a["test"] == b["test"]
    assert len(shared[2]["curve"]["loss"]) == 5 and shared[0]["curve"]["loss"] != shared[2]["curve"]["loss"]


@pytest.mark.parametrize("task", [TaskConfig("copy", alphabet=5, min_len=2, max_len=6),
                                  TaskConfig("mqar", vocab=40, pairs=5, seq_len=24),
                                  TaskConfig("multihop", vocab=32, pairs=6, max_hops=2, queries=2)])
def test_the_loss_on_the_labelled_positions_is_the_loss_over_every_position(task):
    # The step forms the logits of the labelled positions only; the loss and every gradient are
    # those of the cross-entropy over all positions' logits with the others ignored.
    cfg = RunConfig(task=task, mixer="mamba2", width=16, layers=1, heads=2, batch=6, steps=3, val_size=8,
                    test_size=8)
    run = Trainer(cfg)
    tok, tgt = run.stream_in.next()
    rows, lab = run._labelled(tgt)
    assert len(rows) == 6 * task.labels and (tgt != IGNORE).sum() <= len(rows)
    model = run.model
    tok_t = torch.from_numpy(tok)
    full = F.cross_entropy(model(tok_t).flatten(0, 1), torch.from_numpy(tgt).flatten(), ignore_index=IGNORE)
    g_full = torch.autograd.grad(full, list(model.parameters()))
    part = F.cross_entropy(model.logits_at(tok_t, torch.from_numpy(rows)), torch.from_numpy(lab), ignore_index=IGNORE)
    g_part = torch.autograd.grad(part, list(model.parameters()))
    torch.testing.assert_close(part, full, rtol=1e-6, atol=0)
    for a, b in zip(g_part, g_full):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    many = np.full_like(tgt, 1)
    with pytest.raises(ValueError, match="labelled positions"):
        run._labelled(many)


def _evaluate_on_every_position(model, split, batch=7):
    """The evaluation over every position's logits (what :func:`evaluate` computed before it
    formed the labelled positions' only), for comparison."""
    right = total = seq_right = 0
    loss_sum, per_group = 0.0, {}
    with torch.no_grad():
        for lo in range(0, len(split.tokens), batch):
            tgt = torch.from_numpy(split.targets[lo : lo + batch])
            logits = model(torch.from_numpy(split.tokens[lo : lo + batch])).float()
            loss_sum += F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=IGNORE,
                                        reduction="sum").item()
            lab = tgt != IGNORE
            ok = (logits.argmax(-1) == tgt) & lab
            right, total = right + ok.sum().item(), total + lab.sum().item()
            seq_right += (ok.sum(1) == lab.sum(1)).sum().item()
            groups = split.groups[lo : lo + batch]
            for g in np.unique(groups[lab.numpy()]):
                sel = lab.numpy() & (groups == g)
                acc = per_group.setdefault(int(g), [0, 0])
                acc[0], acc[1] = acc[0] + int(ok.numpy()[sel].sum()), acc[1] + int(sel.sum())
    return {"accuracy": right / total, "sequence_accuracy": seq_right / len(split.tokens), "loss": loss_sum / total,
            "per_group": {g: r / n for g, (r, n) in sorted(per_group.items())}}


@pytest.mark.parametrize("task", [TaskConfig("copy", alphabet=3, min_len=1, max_len=3),
                                  TaskConfig("multihop", vocab=32, pairs=6, max_hops=3, queries=2)])
def test_the_evaluation_on_the_labelled_positions_is_the_evaluation_over_every_position(task):
    # Trained a little, so that some positions and whole examples are right and others not.
    cfg = RunConfig(task=task, mixer="attention", width=16, layers=1, heads=2, batch=16, steps=40, lr=1e-2,
                    val_size=50, test_size=50)
    run = Trainer(cfg)
    while not run.done:
        run.step()
    got = evaluate(run.model, run.test, "cpu", batch=7)
    want = _evaluate_on_every_position(run.model, run.test)
    assert 0 < got["accuracy"] < 1 and got["sequence_accuracy"] < 1
    assert got["accuracy"] == want["accuracy"] and got["sequence_accuracy"] == want["sequence_accuracy"]
    assert got["per_group"] == want["per_group"] and len(got["per_group"]) == (3 if task.task == "multihop" else 1)
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-6)


def _stopped_and_resumed(cfg, device, path, stop_at):
    """A run of ``cfg`` stopped after ``stop_at`` steps and checkpointed to ``path``, then
    continued to its end by a new Trainer; its log."""
    first = Trainer(cfg, device)
    for _ in range(stop_at):
        first.step()
    first.checkpoint(path)
    second = Trainer(cfg, device)
    second.restore(path)
    while not second.done:
        second.step()
    return second.log()


def test_a_run_stopped_at_its_deadline_goes_on_from_its_checkpoint_as_if_it_had_not_stopped(tmp_path):
    # The same bits on the CPU: the model, the optimizer's moments and step, the training stream's
    # position in its shuffled pool (reshuffled within the run), the curve and its evaluations.
    for cfg in _shared_process_runs("cpu")[:2]:
        cfg = dataclasses.replace(cfg, train_examples=20)
        whole = train(cfg)
        resumed = _stopped_and_resumed(cfg, "cpu", str(tmp_path / "run.ckpt"), stop_at=4)
        assert whole["curve"] == resumed["curve"] and len(whole["curve"]["val_accuracy"]) == 3
        assert whole["val"] == resumed["val"] and whole["test"] == resumed["test"]
    with pytest.raises(ValueError, match="another run configuration"):
        Trainer(dataclasses.replace(cfg, lr=0.5)).restore(str(tmp_path / "run.ckpt"))


def test_max_seconds_stops_the_command_and_resume_finishes_it(tmp_path):
    argv = ["--budget", "tiny", "--steps", "6", "--out", str(tmp_path), "--quiet", "--only", "attention,toeplitz",
            "--threads", "1"]
    whole = runner.main("toeplitz_copy", "t", argv + ["--out", str(tmp_path / "whole")])
    with pytest.raises(SystemExit) as stop:
        runner.main("toeplitz_copy", "t", argv + ["--max-seconds", "1e-9"])
    assert stop.value.code == 3
    root = tmp_path / "toeplitz_copy" / "runs"
    assert sorted(p.name for p in root.glob("*/*/*")) == ["lr0.01-seed0.json.ckpt"] * 2
    again = runner.main("toeplitz_copy", "t", argv + ["--resume"])
    assert not list(root.glob("*/*/*.ckpt"))
    for rel in ("attention/copy/lr0.01-seed0.json", "toeplitz/copy/lr0.01-seed0.json"):
        a = json.loads((tmp_path / "whole" / "toeplitz_copy" / "runs" / rel).read_text())
        b = json.loads((root / rel).read_text())
        assert a["curve"] == b["curve"] and a["test"] == b["test"]
    strip = lambda cells: [{k: v for k, v in c.items() if k != "wall_s"} for c in cells]  # noqa: E731
    assert strip(whole["cells"]) == strip(again["cells"])
    with pytest.raises(SystemExit, match="--max-seconds"):
        runner.main("toeplitz_copy", "t", argv + ["--max-seconds", "0"])
    # Runs in two processes stop and go on the same way.
    par = argv[:5] + [str(tmp_path / "par")] + argv[6:] + ["--jobs", "2"]
    with pytest.raises(SystemExit):
        runner.main("toeplitz_copy", "t", par + ["--max-seconds", "1e-9"])
    assert len(list((tmp_path / "par").glob("*/runs/*/*/*.ckpt"))) == 2
    resumed = runner.main("toeplitz_copy", "t", par + ["--resume"])
    assert strip(whole["cells"]) == strip(resumed["cells"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_captured_run_goes_on_from_its_checkpoint(tmp_path):
    # Resumed past the capture: the new Trainer warms up and captures again, and trains on.
    for cfg in _shared_process_runs("cuda")[:2]:
        cfg = dataclasses.replace(cfg, steps=12)
        whole = train(cfg, "cuda")
        resumed = _stopped_and_resumed(cfg, "cuda", str(tmp_path / "run.ckpt"), stop_at=6)
        np.testing.assert_allclose(resumed["curve"]["loss"], whole["curve"]["loss"], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(resumed["test"]["loss"], whole["test"]["loss"], rtol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_runs_sharing_a_process_on_their_own_streams_train_as_alone():
    cfgs = _shared_process_runs("cuda")
    alone = [train(c, "cuda") for c in cfgs]
    shared = train_many(cfgs, "cuda")
    for a, b in zip(alone, shared):
        np.testing.assert_allclose(b["curve"]["loss"], a["curve"]["loss"], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(b["test"]["loss"], a["test"]["loss"], rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mixer", ["attention", "glr", "mamba2", "loglinear-gated-deltanet"])
def test_a_captured_training_step_trains_as_the_launched_one(mixer, monkeypatch):
    replays = []
    replay = torch.cuda.CUDAGraph.replay
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda g: (replays.append(1), replay(g))[1])
    base = dict(task=TaskConfig("mqar", vocab=16, pairs=2, seq_len=12), mixer=mixer, width=16, layers=1, heads=2,
                steps=14, batch=16, val_size=64, test_size=64, eval_every=5)
    eager = train(RunConfig(**base, graph=False), "cuda")
    assert not replays
    graphed = train(RunConfig(**base, graph=True), "cuda")
    assert len(replays) == base["steps"] - GRAPH_AFTER
    # The same steps (the captured optimizer reads its learning rate from the device, so the
    # bits may differ in the last places).
    np.testing.assert_allclose(graphed["curve"]["loss"], eager["curve"]["loss"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(graphed["val"]["loss"], eager["val"]["loss"], rtol=1e-4)


@pytest.mark.parametrize("on", ["a", "b", "both"])
@pytest.mark.parametrize("name,config", [("glr", {"pattern": "sq1", "cache_efficient": True}), ("dense-recurrence", {})])
def test_the_glr_layer_puts_its_pattern_where_on_says(name, config, on):
    """The layer's α (pattern on A: a softmax over the token itself and its slots) and β (pattern
    on B) give the literal recurrence y_t = Σ_j α_{t,j} x_{src} + Σ_j β_{t,j} y_{src}, per channel."""
    torch.manual_seed(1)
    t, width, heads = 11, 8, 2
    layer = MixerLayer(name, {**config, "on": on}, width=width, heads=heads, seq=t, layers=1).double()
    captured = {}
    run = layer._run
    layer._run = lambda **inputs: captured.update(inputs) or run(**inputs)
    u = torch.randn(2, t, width, dtype=torch.float64)
    layer(u)
    x, alpha, beta = captured["x"], captured["alpha"], captured.get("beta")
    src, active = layer.src, layer.active
    assert (beta is None) == (on == "a")
    if on == "b":
        assert alpha.shape == x.shape
    else:  # A's weights: a distribution over the token itself and its active slots
        assert alpha.shape == (2, t, src.shape[1] + 1, width)
        assert torch.allclose(alpha.sum(2), torch.ones(()).double())
        assert (alpha[:, :, 1:][:, ~active] == 0).all()
    y = torch.zeros_like(x)
    for i in range(t):
        own = alpha[:, i] * x[:, i] if on == "b" else alpha[:, i, 0] * x[:, i]
        for j in range(src.shape[1]):
            if active[i, j]:
                if on != "b":
                    own = own + alpha[:, i, j + 1] * x[:, src[i, j]]
                if on != "a":
                    own = own + beta[:, i, j] * y[:, src[i, j]]
        y[:, i] = own
    got = layer._run(**captured)
    assert torch.allclose(got, y, atol=1e-12)


def test_the_glr_rows_take_on_from_the_command_line(tmp_path):
    argv = ["--budget", "tiny", "--steps", "2", "--out", str(tmp_path), "--quiet", "--only", "Dense recurrence,Attention",
            "--tasks", "mqar", "--threads", "1", "--glr-on", "both"]
    res = runner.main("table1", "t", argv)
    logs = {p.parent.parent.name: json.loads(p.read_text()) for p in (tmp_path / "table1").glob("runs/*/*/*.json")}
    assert logs["dense-recurrence-on-both"]["config"]["mixer_config"] == {"on": "both"}
    assert logs["attention"]["config"]["mixer_config"] == {}
    assert any("`both`" in n for n in res["notes"])
