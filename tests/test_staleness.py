"""The tabular reproduction of SPO on stale data (softrl/tabular/staleness.py, `softrl bench staleness`):
the restricted policy starts at pi0 and cannot reach pi*, and the mechanism the benchmark reports
holds: with BCE's tail of failure-row gradients bounded (eps 0.1) stale data costs little."""

import json

import pytest
import torch
from typer.testing import CliRunner

from softrl.cli import app
from softrl.tabular.problem import TabularProblem
from softrl.tabular.staleness import Setting, SharedOffsets, summary, train_stale


@pytest.fixture(scope="module")
def problem():
    return TabularProblem.make(vocab=3, length=4, success_rate=0.2, seed=0)


def test_the_policy_starts_at_pi0_and_cannot_represent_pi_star(problem):
    policy = SharedOffsets(problem)
    assert problem.kl_to_optimal([x.detach() for x in policy.logits()]) == pytest.approx(
        problem.kl_to_optimal(problem.ref_logits))
    # the best it can do: minimise KL(pi || pi*) over its offsets directly; it stays well away from 0
    opt = torch.optim.Adam(policy.parameters(), lr=0.1)
    for _ in range(500):
        seq = problem.seq_logp(policy.logits())
        loss = (seq.exp() * (seq - problem.optimal_seq_logp)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() > 0.3


def test_stale_data_hurts_bces_heavy_tail_and_bounding_it_removes_most_of_it(problem):
    def plateau(**change):
        settings = [Setting(lr=0.1, steps=300, seed=k, **change) for k in range(3)]
        return sum(summary(train_stale(problem, s), s)["success_plateau"] for s in settings) / 3

    paper_fresh, paper_stale = plateau(lag=0), plateau(lag=16)
    bounded_fresh, bounded_stale = plateau(lag=0, eps=0.1), plateau(lag=16, eps=0.1)
    assert paper_fresh - paper_stale > 0.2
    assert bounded_fresh - bounded_stale < 0.05 and bounded_stale > paper_stale + 0.3


def test_bench_staleness_writes_its_report(tmp_path):
    result = CliRunner().invoke(app, ["bench", "staleness", "--seeds", "1", "--steps", "20", "--lrs", "0.1",
                                      "--lags", "0,4", "--report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "staleness-tabular.json").read_text())
    assert len(rows) == 7 * 2 and {r["lag"] for r in rows} == {0, 4}
    assert "| paper (BCE, eps 1e-4) | 0.1 |" in (tmp_path / "staleness-tabular.md").read_text()
    assert (tmp_path / "staleness-tabular.png").stat().st_size > 10_000
    bad = CliRunner().invoke(app, ["bench", "staleness", "--lags", "0,x", "--report", str(tmp_path)])
    assert bad.exit_code == 2 and "--lags: '0,x' is not a comma-separated list of whole numbers" in bad.output
