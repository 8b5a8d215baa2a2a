"""A reference that moves (issue 51), on the exact tabular problem: SPO's rounds follow mirror descent,
pi_k ~ pi0 exp(k r / beta), with the exact Q0 and, measurably less closely, with Q0 estimated online
from the groups it samples; the online estimate's bias, exactly."""

import math

import pytest
import torch

from softrl.algorithms.spo import q0_from_rewards, q0_from_samples
from softrl.tabular import SPO_BETA, TabularProblem
from softrl.tabular.moving import q0_bias, reference_rounds
from softrl.toy import METHODS

SPO = METHODS["spo-terminal-bce"]


@pytest.fixture(scope="module")
def problem():
    torch.set_num_threads(1)
    # beta 0.5: each round tilts by exp(r / 0.5), so three rounds are three distinct policies (at the
    # paper's beta the first round already puts all but 2e-4 of the mass on passing sequences)
    return TabularProblem.make(vocab=2, length=4, success_rate=0.25, seed=0, beta=0.5)


def test_the_closed_form_is_one_optimum_at_a_k_times_smaller_beta(problem):
    for k in (1, 2, 3):
        tilted = TabularProblem(problem.vocab, problem.length, problem.beta / k, problem.ref_logits, problem.reward)
        assert torch.allclose(problem.mirror_descent_seq_logp(k), tilted.optimal_seq_logp, atol=1e-12)
    with pytest.raises(ValueError, match="deterministic"):
        TabularProblem.make(vocab=2, length=3, turns=2, env="stochastic").mirror_descent_seq_logp(1)


def test_spo_with_a_reference_moved_after_each_convergence_follows_mirror_descent(problem):
    rounds = reference_rounds(problem, SPO.loss, 3)
    assert [r.round for r in rounds] == [1, 2, 3]
    assert max(r.kl_to_closed_form for r in rounds) < 1e-3, rounds
    rewards = [r.reward for r in rounds]
    assert rewards[0] < rewards[1] < rewards[2] < 0  # each move tilts further towards passing
    # the rounds are distinct policies: the closed form of round 1 is far from round 3's
    logp = problem.mirror_descent_seq_logp(1)
    assert (logp.exp() * (logp - problem.mirror_descent_seq_logp(3))).sum() > 0.1


def test_agro_with_a_reference_moved_after_each_convergence_follows_mirror_descent_with_no_q0(problem):
    """AGRO's consistency compares a group's generations with each other, so its rounds need no Q0 of the
    moved reference: on the round reference's samples (off-policy for the policy), each lands on the closed form."""
    agro = METHODS["agro-off"]
    rounds = reference_rounds(problem, agro.loss, 3, group_size=agro.group_size)
    assert max(r.kl_to_closed_form for r in rounds) < 1e-6, rounds
    assert rounds[0].reward < rounds[1].reward < rounds[2].reward < 0


def test_a_q0_estimated_from_each_group_is_low_and_moves_the_fixed_point_a_little(problem):
    """From a group of 4 of the reference's samples (the exact expectation over every group), round 1
    lands near its optimum, but measurably farther than with the exact Q0; the jackknife, which removes
    the estimate's 1/K bias where the expansion holds, lands farther still: one rare pass in a group
    sends its estimate above every reward."""
    exact = reference_rounds(problem, SPO.loss, 1)[0]
    group = reference_rounds(problem, SPO.loss, 1, q0="group", group_size=4)[0]
    jackknife = reference_rounds(problem, SPO.loss, 1, q0="jackknife", group_size=4)[0]
    assert exact.kl_to_closed_form < group.kl_to_closed_form < 1e-2 < jackknife.kl_to_closed_form
    one_pass = torch.tensor([0.0, -1.0, -1.0, -1.0], dtype=torch.float64)
    assert q0_from_samples(one_pass, torch.zeros(4, dtype=torch.float64), SPO_BETA, "jackknife") > 0


def test_sampled_spo_with_online_q0_tracks_the_moving_reference(problem):
    rounds = reference_rounds(problem, SPO.loss, 3, q0="group", group_size=8, samples=64, steps=1500,
                              max_grad_norm=1.0)
    assert max(r.kl_to_closed_form for r in rounds) < 1e-2, rounds


def test_the_online_q0_bias_exactly():
    """Low for every group size (Jensen), shrinking as the group grows; at the paper's beta a group of 4
    with a 5% pass rate is off by more than half a reward unit."""
    for beta in (SPO_BETA, 0.5):
        for success in (0.05, 0.25, 0.5):
            biases = [q0_bias(success, k, beta) for k in (2, 4, 8, 16, 64)]
            assert all(b < 0 for b in biases) and biases == sorted(biases)
    assert q0_bias(0.05, 4, SPO_BETA) < -0.5 and q0_bias(0.5, 64, SPO_BETA) > -0.01
    assert q0_bias(0.25, 1, 0.5) == pytest.approx(0.25 * 0 + 0.75 * -1 - 0.5 * math.log(0.25 + 0.75 * math.exp(-2)))


def test_importance_weights_make_another_policys_samples_estimate_the_reference():
    """Q0 of pi0 from mu's samples: with w = pi0 / mu the mean inside the log is pi0's; equal weights are
    `q0_from_rewards`; the leave-one-out form of the jackknife matches its definition."""
    rewards = torch.tensor([[0.0, -1.0, -0.5]], dtype=torch.float64)
    assert torch.allclose(q0_from_samples(rewards, torch.zeros_like(rewards), 0.3), q0_from_rewards(rewards, 0.3))
    # two outcomes, mu puts 1/2 on each, pi0 puts 0.9 on the first: the weights 1.8 and 0.2
    two = torch.tensor([[0.0, -1.0]], dtype=torch.float64)
    w = torch.log(torch.tensor([[1.8, 0.2]], dtype=torch.float64))
    expected = 0.3 * math.log(0.9 * 1 + 0.1 * math.exp(-1 / 0.3))
    assert q0_from_samples(two, w, 0.3).item() == pytest.approx(expected)
    f = lambda r: 0.3 * math.log(sum(math.exp(x / 0.3) for x in r) / len(r))  # noqa: E731
    r = [0.0, -1.0, -0.5]
    jack = 3 * f(r) - 2 * sum(f(r[:j] + r[j + 1:]) for j in range(3)) / 3
    assert q0_from_samples(rewards, torch.zeros_like(rewards), 0.3, "jackknife").item() == pytest.approx(jack)
    with pytest.raises(ValueError, match="correction"):
        q0_from_samples(rewards, torch.zeros_like(rewards), 0.3, "bootstrap")


# --- the learner's moving reference (training/moving_reference.py) -------------------------------------------
def test_the_reference_moves_to_a_snapshot_and_each_version_pools_its_own_samples():
    """Every `every` steps the copy becomes the policy (the starting model it was copied from is left
    alone); a version's Q0 of a prompt pools that version's samples, importance-weighted, and forgets the
    last version's; prompts with none keep the stored estimate; rows of unknown samplers add nothing."""
    from softrl.models.device import CPU
    from softrl.models.wrappers import ReferenceModel
    from softrl.training.moving_reference import MovingReference

    torch.manual_seed(0)
    start, policy = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    moving = MovingReference(ReferenceModel(start, None), CPU, beta=0.5, every=3)
    stored = torch.tensor([-0.7, -0.7, -0.9], dtype=torch.float64)
    counts = {}
    same = moving.q0(["a", "a", "b"], stored, torch.ones(3), torch.zeros(3), torch.ones(3, dtype=torch.bool), counts)
    assert torch.equal(same, stored) and counts == {"q0/stored_rows": 3}  # version 0: pi0's stored Q0
    assert not moving.after_step(2, policy) and moving.version == 0
    assert moving.after_step(3, policy) and moving.version == 1
    assert torch.equal(moving.model.model.weight, policy.weight) and not torch.equal(start.weight, policy.weight)
    counts = {}
    reward, log_w = torch.tensor([1.0, 0.0, 1.0]), torch.log(torch.tensor([2.0, 0.5, 1.0]))
    got = moving.q0(["a", "a", "c"], stored, reward, log_w, torch.tensor([True, True, False]), counts)
    # self-normalised: sum w e^(r/beta) / sum w, so it stays within the rewards seen
    assert got[0] == got[1] == pytest.approx(0.5 * math.log((2.0 * math.exp(2) + 0.5) / 2.5))
    assert got[2] == stored[2] and counts == {"q0/online_rows": 2, "q0/stored_rows": 1, "q0/samples_per_row": 4}
    again = moving.q0(["a"], stored[:1], torch.tensor([0.0]), torch.zeros(1), torch.tensor([True]), {})
    assert again[0] == pytest.approx(0.5 * math.log((2.0 * math.exp(2) + 0.5 + 1.0) / 3.5))  # pooled over steps
    heavy = moving.q0(["h"], stored[:1], torch.tensor([1.0]), torch.tensor([math.log(50.0)]), torch.tensor([True]), {})
    assert heavy[0] == pytest.approx(1.0)  # one pass with a weight of 50: the top reward, not above it
    broken = moving.q0(["h"], stored[:1], torch.tensor([0.0]), torch.tensor([math.nan]), torch.tensor([True]), {})
    assert broken[0] == pytest.approx(1.0) and moving.sums["h"][2] == 1  # a weight that is not finite adds nothing
    moving.after_step(6, policy)
    assert moving.version == 2 and moving.sums == {}
    state = moving.state_dict()
    other = MovingReference(ReferenceModel(torch.nn.Linear(3, 2), None), CPU, beta=0.5, every=3)
    other.load_state_dict(state)
    assert other.version == 2 and torch.equal(other.model.model.weight, policy.weight)


def test_a_moving_average_reference_steps_towards_the_policy_and_forgets_old_samples_at_its_rate():
    """ema: after every step ref <- tau ref + (1 - tau) pi, weight by weight (the starting model left alone);
    the Q0 sums carry over, each step scaling the older terms by tau."""
    from softrl.models.device import CPU
    from softrl.models.wrappers import ReferenceModel
    from softrl.training.moving_reference import MovingReference

    torch.manual_seed(0)
    start, policy = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    before = start.weight.detach().clone()
    moving = MovingReference(ReferenceModel(start, None), CPU, beta=0.5, ema=0.75)
    assert moving.after_step(1, policy) and moving.version == 1
    assert torch.allclose(moving.model.model.weight, 0.75 * before + 0.25 * policy.weight)
    assert torch.equal(start.weight, before)
    stored, one = torch.tensor([-0.7], dtype=torch.float64), torch.tensor([True])
    moving.q0(["a"], stored, torch.tensor([1.0]), torch.zeros(1), one, {})
    moving.after_step(2, policy)
    assert torch.allclose(moving.model.model.weight, 0.75 ** 2 * before + (1 - 0.75 ** 2) * policy.weight)
    got = moving.q0(["a"], stored, torch.tensor([0.0]), torch.zeros(1), one, {})
    # the solved sample of the step before counts 0.75, the new failed one 1
    assert got[0] == pytest.approx(0.5 * math.log((0.75 * math.exp(2) + 1.0) / 1.75))
    with pytest.raises(ValueError, match="give one of every"):
        MovingReference(ReferenceModel(start, None), CPU, beta=0.5, every=2, ema=0.9)


class Tied(torch.nn.Module):
    """An embedding tied to the output layer, as the bootstrap models' (tie_word_embeddings)."""

    def __init__(self):
        super().__init__()
        self.embed, self.out = torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False)
        self.out.weight = self.embed.weight
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))


@pytest.mark.parametrize("stored", [torch.float32, torch.bfloat16])
def test_a_moving_average_averages_a_tied_weight_once_and_keeps_its_steps_in_a_low_precision_copy(stored):
    """A tied tensor moves by 1 - tau a step, not 1 - tau^2 (a state_dict names it twice); where the copy is
    stored in bf16 the average is kept in the trained dtype, so 50 steps of 1% each are not rounded away; the
    average comes back with a checkpoint."""
    from softrl.models.device import Placement
    from softrl.models.wrappers import ReferenceModel
    from softrl.training.moving_reference import MovingReference

    torch.manual_seed(0)
    start, policy = Tied(), Tied()
    with torch.no_grad():
        policy.embed.weight.copy_(start.embed.weight + 0.01)  # a step a bf16 weight near 1 cannot hold
    policy.steps.fill_(7)
    placement = Placement(torch.device("cpu"), torch.float32, None if stored == torch.float32 else stored)
    moving = MovingReference(ReferenceModel(start, None), placement, beta=0.5, ema=0.99)
    first = moving.model.model.embed.weight.float().clone()
    for step in range(50):
        moving.after_step(step + 1, policy)
    copy_ = moving.model.model.embed.weight
    average = copy_ if moving.average is None else moving.average["embed.weight"]
    moved = (average - start.embed.weight).mean().item()
    assert moved == pytest.approx(0.01 * (1 - 0.99 ** 50), rel=1e-3)  # once a step, nothing rounded away
    assert copy_.dtype == stored and torch.equal(copy_, average.to(stored)) and moving.model.model.steps.item() == 7
    assert (copy_.float() != first).any()  # each step alone (1e-4) is below a bf16 weight's half step near 1
    other = MovingReference(ReferenceModel(Tied(), None), placement, beta=0.5, ema=0.99)
    other.load_state_dict(moving.state_dict())
    other.after_step(51, policy)
    moving.after_step(51, policy)
    assert torch.equal(other.model.model.embed.weight, moving.model.model.embed.weight)


@pytest.mark.parametrize("update, versions, resumed_versions", [({"every": 2}, [0, 1, 1, 2], [2, 3]),
                                                                ({"ema": 0.5}, [1, 2, 3, 4], [5, 6])])
def test_a_run_with_a_moving_reference_records_its_versions_and_resumes_them(tiny, tmp_path, update, versions,
                                                                             resumed_versions):
    import softrl
    from test_api import RECORDS, answered, small

    config = {**small(tiny, tmp_path), "data.objective": {"algorithm": "spo", "reference_update": update},
              "optim.steps": 4}
    run = softrl.train(config, dataset=RECORDS, reward=answered, progress=False)
    steps = [m for m in run.metrics if "reference/version" in m]
    assert [m["reference/version"] for m in steps] == versions
    assert steps[0]["q0/stored_rows"] == 4 and "q0/online_rows" not in steps[0]  # pi0: the store's Q0
    assert steps[2]["q0/online_rows"] == 4 and steps[2]["q0/samples_per_row"] >= 2  # its own group at least
    resumed = softrl.train({**config, "optim.steps": 6}, dataset=RECORDS, reward=answered, resume=True, progress=False)
    later = [m["reference/version"] for m in resumed.metrics if "reference/version" in m]
    assert later[-2:] == resumed_versions  # the version came back with the checkpoint


@pytest.mark.parametrize("update, says", [
    ({"every": 2, "behavior": True}, "give one of every"),
    ({"every": 2, "ema": 0.9}, "give one of every"),
    ({"ema": 1.0}, "less than 1"),
    ({}, "give one of every"),
    ({"behavior": False}, "give one of every"),
])
def test_a_reference_update_is_one_of_its_kinds(update, says):
    from softrl.config import ConfigError, config_from

    with pytest.raises(ConfigError, match=says):
        config_from({"data.objective": {"algorithm": "spo", "reference_update": update}})
    with pytest.raises(ConfigError, match="behavior: SPO's only"):
        config_from({"data.objective": {"algorithm": "agro-off", "reference_update": {"behavior": True}}})
    with pytest.raises(ConfigError, match="not an average of the policies"):
        config_from({"data.objective": {"algorithm": "spo", "reference_update": {"ema": 0.9}}, "model.lora": {"r": 4}})
    with pytest.raises(ConfigError, match="is_rows: failed picks the rows is_correction weighs"):
        config_from({"data.objective": {"algorithm": "spo", "is_rows": "failed"}})


@pytest.mark.parametrize("change, says", [
    ({"runtime.learners": 2}, "runtime.learners=1"),
    ({"data.mix": {"offline": 1.0}}, "no online share"),
    ({"sampling.temperature": 0.7}, "temperature=1"),
    ({"data.mix": {"online": 0.5, "offline": 0.5},
      "data.objectives": {"offline": {"algorithm": "spo", "reference_update": {"every": 2}}}}, "one reference"),
    ({"data.mix": {"online": 0.5, "mc": 0.5}}, "Monte-Carlo targets"),
])
def test_a_moving_reference_is_refused_where_it_cannot_work(change, says):
    from softrl.config import ConfigError, config_from

    with pytest.raises(ConfigError, match=says):
        config_from({"data.objective": {"algorithm": "spo", "reference_update": {"every": 2}}, **change})
    assert config_from({"data.objective": {"algorithm": "agro-off", "reference_update": {"every": 2}},
                        "data.mix": {"offline": 1.0}}).data.objective.reference_update.every == 2  # no Q0 needed
    with pytest.raises(ConfigError, match="temperature=1"):  # SPO on another source still needs the online Q0
        config_from({"data.objective": {"algorithm": "kl-pg", "reference_update": {"every": 2}},
                     "data.objectives": {"offline": {"algorithm": "spo"}}, "sampling.temperature": 0.7})


def test_softrl_toy_reference_moves_prints_the_rounds_and_the_bias_as_json():
    import json

    from typer.testing import CliRunner

    from softrl.cli import app

    result = CliRunner().invoke(app, ["toy", "--reference-moves", "2", "--length", "3", "--steps", "150", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["beta"] == 0.5 and {r["q0"] for r in data["rounds"]} == {"exact", "group of 4", "jackknife of 4"}
    assert [r["round"] for r in data["rounds"] if r["q0"] == "exact"] == [1, 2]
    assert all(b["bias"] < 0 for b in data["q0_bias"]) and [b["group"] for b in data["q0_bias"]] == [2, 4, 8, 16, 64]
    refused = CliRunner().invoke(app, ["toy", "--reference-moves", "1", "--methods", "grpo"])
    assert refused.exit_code == 2 and "valid on any data" in refused.output and "Traceback" not in refused.output


def test_each_groups_q0_is_the_plain_estimate_of_its_own_rows():
    """`group_q0`: the usable rows of one key (one sampler's samples of one prompt) share
    beta log mean exp(r / beta) of their rewards; rows of another key or not usable are not mixed in."""
    from softrl.training.learner import group_q0

    keys = [("a", 3), ("a", 3), ("a", 4), ("b", 3), ("a", 3)]
    reward = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0])
    usable = torch.tensor([True, True, True, True, False])
    got = group_q0(keys, reward, usable, beta=0.5)
    assert got[0] == got[1] == pytest.approx(0.5 * math.log((math.exp(2) + 1) / 2))  # not row 4: unusable
    assert got[2] == pytest.approx(1.0) and got[3] == pytest.approx(0.0) and got[4] == 0.0


def test_with_the_behaviour_policy_as_reference_online_rows_regress_against_their_sampler(tiny, tmp_path, monkeypatch):
    """`reference_update: {behavior: true}`: an online row's reference log-probs are its sampler's own and its
    Q0 its group's estimate; every step says how many rows had them."""
    import softrl
    from softrl.training import learner as learner_module
    from test_api import RECORDS, answered, small

    seen = []

    def recording(options, inputs):
        seen.append(inputs)
        return learner_module.objective_loss.__wrapped__(options, inputs)

    recording.__wrapped__ = learner_module.objective_loss
    monkeypatch.setattr(learner_module, "objective_loss", recording)
    config = {**small(tiny, tmp_path), "data.objective": {"algorithm": "spo", "reference_update": {"behavior": True}}}
    run = softrl.train(config, dataset=RECORDS, reward=answered, progress=False)
    steps = [m for m in run.metrics if "loss" in m]
    assert [m["q0/group_rows"] for m in steps] == [4, 4] and "reference/version" not in steps[0]
    assert seen
    for inputs in seen:
        mask = inputs.mask.bool()
        assert torch.equal(inputs.ref_logp[mask], inputs.behavior_logp[mask])  # the sampler's, token by token
        reward = inputs.reward.double()
        for start in range(0, len(reward), 2):  # groups of samples_per_prompt = 2, one prompt and version each
            group = slice(start, start + 2)
            want = inputs.beta * (torch.logsumexp(reward[group] / inputs.beta, 0) - math.log(2))
            assert torch.allclose(inputs.q0[group].double(), want.expand(2))


def test_a_source_whose_own_objective_keeps_the_reference_regresses_against_the_starting_model(tiny, tmp_path,
                                                                                             monkeypatch):
    """With a moving reference on `data.objective`, a source whose own objective (`data.objectives`) has no
    reference_update learns against the starting model with the store's Q0 of it; every step counts its rows."""
    import softrl
    from softrl.training import learner as learner_module
    from test_api import RECORDS, small

    seen, original = [], learner_module.Learner.inputs

    def inputs(self, part, options, group_size):
        x, entropy = original(self, part, options, group_size)
        with torch.no_grad():
            seen.append((options.reference_update, x, part.q0.clone(), self.reference.stats(part.padded).logp,
                         self.moving.model.stats(part.padded).logp))
        return x, entropy

    monkeypatch.setattr(learner_module.Learner, "inputs", inputs)
    config = {**small(tiny, tmp_path), "data.objective": {"algorithm": "spo", "reference_update": {"ema": 0.5}},
              "data.objectives": {"offline": {"algorithm": "spo"}}, "data.offline_passed_only": False,
              "optim.steps": 3, "optim.lr": 0.05, "optim.warmup_steps": 0}
    def alternate(prompts, completions, **kwargs):  # a solved and a failed row in every group: the policy moves
        return [float(i % 2) for i in range(len(completions))]

    run = softrl.train(config, dataset=RECORDS, reward=alternate, progress=False)
    steps = [m for m in run.metrics if "loss" in m]
    assert [m["q0/start_rows"] for m in steps] == [4, 4, 4]  # 4 offline rows a step, as many as online
    assert all(m.get("q0/stored_rows", 0) + m.get("q0/online_rows", 0) == 4 for m in steps)
    kept = [s for s in seen if s[0] is None]
    moved = [s for s in seen if s[0] is not None]
    assert len(kept) == len(moved) == 3
    for _, x, stored_q0, start, now in kept:
        mask = x.mask.bool()
        assert torch.allclose(x.ref_logp[mask], start[mask]) and torch.equal(x.q0, stored_q0)
    _, x, _, start, now = kept[-1]
    assert (now - start)[x.mask.bool()].abs().max() > 1e-3  # the moving reference had moved: not a test of nothing
    for _, x, _, _, now in moved:
        mask = x.mask.bool()
        assert torch.allclose(x.ref_logp[mask], now[mask])
