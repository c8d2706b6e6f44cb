"""Scaling-law fits: recovery of known laws (synthetic and Chinchilla's published one), budgets, refusals, plot."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from marin.scaling.estimates import Estimate, judged
from marin.scaling.fits import (
    ParametricFit,
    ScalingFitError,
    fit_isoflop,
    fit_parametric,
    group_by_budget,
)
from marin.scaling.plot import plot_scaling
from marin.scaling.points import ScalingRun

# The law the synthetic sweep is drawn from, and the allocation it implies.
TRUE = ParametricFit.from_coefficients(E=1.8, A=400.0, B=600.0, alpha=0.33, beta=0.29)
TRUE_SIZE_EXPONENT = 0.29 / (0.33 + 0.29)
BUDGETS = (1e18, 1e19, 1e20, 1e21, 1e22)
CHINCHILLA = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}


def _run(params: float, tokens: float, loss: float, budget: float | None = None, k: float = 6.0) -> ScalingRun:
    return ScalingRun(name=f"n{params:.3g}-d{tokens:.3g}", params=params, tokens=tokens, flops=k * params * tokens,
                      loss=loss, budget=budget)


def _isoflop_sweep(seed: int = 0, noise: float = 0.007) -> list[ScalingRun]:
    """5 budgets x 7 sizes spanning 1.6 decades around each budget's true best size, D = C/(6N), log-normal noise."""
    rng = np.random.default_rng(seed)
    runs = []
    for budget in BUDGETS:
        best_size, _ = TRUE.optimal(budget)
        for offset in np.linspace(-0.8, 0.8, 7):
            params = best_size * 10.0**offset
            tokens = budget / (6.0 * params)
            runs.append(_run(params, tokens, TRUE.loss(params, tokens) * np.exp(rng.normal(0.0, noise)), budget))
    return runs


@pytest.fixture(scope="module")
def sweep() -> list[ScalingRun]:
    return _isoflop_sweep()


@pytest.fixture(scope="module")
def parametric(sweep) -> ParametricFit:
    return fit_parametric(sweep, bootstrap=50)


def test_parametric_fit_recovers_the_exponents_within_narrow_bootstrap_intervals(parametric):
    assert len(parametric.refits) == 50
    for fitted, true in ((parametric.alpha, 0.33), (parametric.beta, 0.29)):
        assert fitted.contains(true), (fitted, true)
        assert fitted.low <= fitted.value <= fitted.high
        assert fitted.high - fitted.low < 0.1
    assert parametric.params_exponent.contains(TRUE_SIZE_EXPONENT)
    assert parametric.params_exponent.value + parametric.tokens_exponent.value == pytest.approx(1.0)
    assert parametric.flops_per_param_token == pytest.approx(6.0)


def test_parametric_fit_of_a_known_law_identifies_every_value_and_holds_the_truth_in_its_intervals(parametric):
    assert parametric.unidentified() == []
    for name in ("E", "A", "B", "alpha", "beta"):
        fitted, true = getattr(parametric, name), getattr(TRUE, name).value
        assert fitted.identified and fitted.contains(true), (name, fitted, true)
    true_size, true_tokens = TRUE.optimal(1e20)
    inside = parametric.optimum(1e20)  # a budget of the sweep: no extrapolation
    assert not inside.unidentified and not inside.extrapolated
    assert inside.params.contains(true_size) and inside.tokens.contains(true_tokens)
    assert inside.params.value == pytest.approx(parametric.optimal(1e20)[0])


def test_an_optimum_beyond_the_largest_budget_is_flagged_and_its_interval_widens(parametric):
    largest = max(BUDGETS)
    at_edge, beyond = parametric.optimum(largest), parametric.optimum(100 * largest)
    assert at_edge.largest_budget == largest and not at_edge.extrapolated
    assert beyond.extrapolated and beyond.beyond == pytest.approx(100.0)
    assert beyond.params.contains(TRUE.optimal(100 * largest)[0])
    assert beyond.params.high / beyond.params.low > at_edge.params.high / at_edge.params.low
    record = beyond.to_json()
    assert record["beyond_largest_budget"] == pytest.approx(100.0) and record["params"]["low"] == beyond.params.low


def test_judged_marks_values_on_a_bound_reaching_one_or_spread_over_orders_of_magnitude():
    assert judged(Estimate(5.0, 4.1, 5.0), lower=1e-3, upper=5.0).unidentified == "at its upper bound 5"
    assert judged(Estimate(2.0, 2e-9, 2.5), lower=2e-9, lower_means="no loss floor").unidentified == (
        "its interval reaches the lower bound 2e-09 (no loss floor)")
    assert judged(Estimate(30.0, 12.0, 5e18)).unidentified == "its interval spans 18 orders of magnitude"
    assert judged(Estimate(400.0, 300.0, 29_000.0)).identified  # under a factor of 100
    assert judged(Estimate(0.3, 0.3, 0.3), lower=1e-3, upper=5.0).identified  # no refits: only the bounds judge


def _degenerate_runs(loss) -> list[ScalingRun]:
    return [_run(params, budget / (6 * params), loss(params, budget / (6 * params)), budget)
            for budget in (1e13, 1e14, 1e15) for params in (1e4, 2e4, 4e4, 8e4)]


def test_an_exponent_pinned_at_its_bound_is_not_identified_and_no_optimum_is_given():
    # Loss falls with size far faster than any power the fit allows (alpha <= 5): it stops on the bound.
    fit = fit_parametric(_degenerate_runs(lambda n, d: 2 + 0.5 * (1e4 / n) ** 8 + 300 / d**0.3), bootstrap=30)
    assert fit.alpha.value == 5.0 and fit.alpha.unidentified == "at its upper bound 5"
    # A is the size term at N = 1: with its exponent on a bound, it means nothing either.
    assert fit.A.unidentified == "rests on alpha, which is not identified" and fit.B.identified
    assert fit.beta.identified and fit.beta.contains(0.3)
    assert fit.params_exponent.unidentified == "alpha: at its upper bound 5"
    optimum = fit.optimum(1e16)
    assert optimum.params is None and optimum.tokens is None
    assert "alpha: at its upper bound 5" in optimum.unidentified
    assert optimum.to_json() == {"flops": 1e16, "largest_budget": 1e15, "beyond_largest_budget": pytest.approx(10.0),
                                 "unidentified": optimum.unidentified}


def test_a_term_the_runs_cannot_see_leaves_its_coefficient_and_exponent_unidentified():
    # Loss does not depend on size at all: whatever A and alpha the search stops at, they say nothing.
    fit = fit_parametric(_degenerate_runs(lambda n, d: 2 + 300 / d**0.3), bootstrap=20)
    assert fit.A.unidentified == fit.alpha.unidentified
    assert fit.alpha.unidentified.startswith("A/N^alpha changes by less than 0.1% of the loss across the runs")
    assert fit.beta.identified and fit.beta.value == pytest.approx(0.3, rel=1e-6)  # noise-free: the rest is recovered
    assert fit.unidentified() == [f"A and alpha: {fit.alpha.unidentified}"]
    assert fit.optimum(1e16).unidentified == f"A and alpha: {fit.alpha.unidentified}"


def test_a_coefficient_is_judged_at_the_runs_scale_not_at_one_parameter(parametric):
    # A's interval at N = 1 carries alpha's spread (A moves by N**alpha); the term at the runs' own
    # sizes is what they pin, and that is what decides whether A is identified.
    assert parametric.A.identified and parametric.B.identified
    typical = np.exp(np.mean(np.log([run.params for run in parametric.runs])))
    refits = np.array(parametric.refits)
    at_scale = refits[:, 1] / typical ** refits[:, 3]
    assert np.percentile(at_scale, 97.5) / np.percentile(at_scale, 2.5) < parametric.A.high / parametric.A.low


def test_an_optimum_known_only_to_within_a_factor_of_ten_is_not_given():
    from marin.scaling.estimates import optimum_from

    wide = optimum_from(1e20, 1e19, 1e8, 1e11, np.geomspace(2e7, 5e8, 50), np.geomspace(2e10, 5e11, 50), 0.95)
    assert wide.params is None and wide.unidentified.startswith("N_opt's interval at this budget spans a factor of")
    narrow = optimum_from(1e20, 1e19, 1e8, 1e11, np.geomspace(6e7, 1.5e8, 50), np.geomspace(7e10, 1.6e11, 50), 0.95)
    assert narrow.params.value == 1e8 and narrow.extrapolated and narrow.beyond == pytest.approx(10.0)


def test_one_budget_cannot_separate_size_from_tokens(sweep):
    # On one budget D = C/(6N): the size and token terms move together, and their coefficients spread
    # over many orders of magnitude across the refits.
    one_budget = [run for run in _isoflop_sweep(noise=0.005) if run.budget == 1e20]
    fit = fit_parametric(one_budget, bootstrap=50)
    assert any("orders of magnitude" in reason for reason in fit.unidentified(("A", "B")))
    assert fit.optimum(1e21).params is None


def test_isoflop_exponents_without_any_interval_are_not_identified(caplog):
    # Three sizes per budget: each parabola passes through its runs exactly, so no noise can be estimated.
    runs = [run for i, run in enumerate(_isoflop_sweep()) if i % 7 in (2, 3, 4)]  # the middle 3 of each budget's 7
    assert {len(members) for members in group_by_budget(runs).values()} == {3}
    with caplog.at_level(logging.WARNING, logger="marin.scaling.fits"):
        fit = fit_isoflop(runs, bootstrap=50)
    assert fit.params_opt.exponent.unidentified.startswith("no interval: every budget's parabola passes through")
    assert fit.optimum(1e22).params is None
    bare = fit_isoflop(runs, bootstrap=0)  # no interval asked for: none is missing
    assert bare.params_opt.exponent.identified and bare.optimum(1e22).params.value == pytest.approx(bare.optimal(1e22)[0])


def test_isoflop_optimum_has_an_interval_and_flags_extrapolation(sweep):
    fit = fit_isoflop(sweep, bootstrap=100)
    true_size, _ = TRUE.optimal(1e21)
    inside, beyond = fit.optimum(1e21), fit.optimum(1e24)
    assert not inside.extrapolated and inside.params.contains(true_size)
    assert beyond.extrapolated and beyond.beyond == pytest.approx(100.0)
    assert beyond.params.high / beyond.params.low > inside.params.high / inside.params.low


def test_parametric_optimum_is_near_the_true_compute_optimal_size(parametric):
    true_size, true_tokens = TRUE.optimal(1e20)
    size, tokens = parametric.optimal(1e20)
    assert 1 / 1.5 < size / true_size < 1.5
    assert 6.0 * size * tokens == pytest.approx(1e20)


def test_isoflop_fit_recovers_the_size_exponent_and_its_exponents_sum_to_one(sweep):
    fit = fit_isoflop(sweep, bootstrap=100)
    assert [curve.budget for curve in fit.curves] == list(BUDGETS)
    assert fit.params_opt.exponent.contains(TRUE_SIZE_EXPONENT), fit.params_opt.exponent
    assert fit.params_opt.exponent.value == pytest.approx(TRUE_SIZE_EXPONENT, abs=0.03)
    # C = 6 N D on every curve, so log D_opt = log C - log 6 - log N_opt.
    assert fit.params_opt.exponent.value + fit.tokens_opt.exponent.value == pytest.approx(1.0, abs=1e-9)
    true_size, _ = TRUE.optimal(1e20)
    size, tokens = fit.optimal(1e20)
    assert 1 / 1.5 < size / true_size < 1.5
    assert 6.0 * size * tokens == pytest.approx(1e20, rel=1e-6)
    for curve in fit.curves:
        assert curve.loss_at(curve.params_opt) == pytest.approx(curve.loss_opt)
        assert curve.loss_at(curve.params_opt * 3) > curve.loss_opt
        assert 6.0 * curve.params_opt * curve.tokens_opt == pytest.approx(curve.budget)


def test_fits_are_deterministic_for_a_seed_and_collapse_without_bootstrap(sweep):
    assert fit_isoflop(sweep, bootstrap=20, seed=3) == fit_isoflop(sweep, bootstrap=20, seed=3)
    assert fit_isoflop(sweep, bootstrap=20, seed=3).params_opt != fit_isoflop(sweep, bootstrap=20, seed=4).params_opt
    first, second = fit_parametric(sweep, bootstrap=5, seed=1), fit_parametric(sweep, bootstrap=5, seed=1)
    assert first.refits == second.refits and first.alpha == second.alpha
    bare = fit_isoflop(sweep, bootstrap=0).params_opt.exponent
    assert bare.low == bare.value == bare.high


def test_published_chinchilla_coefficients_give_the_papers_allocation_exponents():
    law = ParametricFit.from_coefficients(**CHINCHILLA)
    # The paper rounds a and b to 0.46 and 0.54; its coefficients are themselves rounded.
    assert law.params_exponent.value == pytest.approx(0.46, abs=0.01)
    assert law.tokens_exponent.value == pytest.approx(0.54, abs=0.01)
    size, tokens = law.optimal(5.76e23)
    assert 6.0 * size * tokens == pytest.approx(5.76e23)
    assert law.loss(size, tokens) < law.loss(size * 2, tokens / 2)
    assert law.loss(size, tokens) < law.loss(size / 2, tokens * 2)


def test_parametric_fit_recovers_chinchillas_coefficients_from_noise_free_losses():
    law = ParametricFit.from_coefficients(**CHINCHILLA)
    runs = [_run(params, tokens, law.loss(params, tokens))
            for params in np.geomspace(7e7, 1.6e10, 6) for tokens in np.geomspace(5e9, 5e11, 6)]
    fit = fit_parametric(runs, bootstrap=0)
    assert fit.alpha.value == pytest.approx(0.34, abs=0.01)
    assert fit.beta.value == pytest.approx(0.28, abs=0.01)
    assert fit.E.value == pytest.approx(1.69, rel=0.01)
    assert fit.optimal(5.76e23)[0] == pytest.approx(law.optimal(5.76e23)[0], rel=0.05)


def test_group_by_budget_uses_declared_budgets():
    runs = [_run(1e8, 1e9, 3.0, budget=1e18), _run(2e8, 5e8, 3.1, budget=1e18), _run(1e8, 1e10, 2.9, budget=1e19)]
    groups = group_by_budget(runs)
    assert list(groups) == [1e18, 1e19]
    assert [run.params for run in groups[1e18]] == [1e8, 2e8]


def test_group_by_budget_groups_undeclared_runs_by_flops_within_the_tolerance():
    def run(flops: float) -> ScalingRun:
        return ScalingRun(name=f"{flops:.3g}", params=1e8, tokens=flops / 6e8, flops=flops, loss=3.0)

    # 1.3e18 exceeds the group's first run (1e18) by more than 25%: it starts the next group.
    groups = group_by_budget([run(1.2e18), run(1e19), run(1e18), run(1.3e18), run(1.1e19)])
    assert [[r.flops for r in members] for members in groups.values()] == [[1e18, 1.2e18], [1.3e18], [1e19, 1.1e19]]
    assert list(groups)[0] == pytest.approx(np.sqrt(1e18 * 1.2e18))
    assert len(group_by_budget([run(1e18), run(1.3e18)], tolerance=0.5)) == 1


def test_isoflop_fit_refuses_too_few_usable_budgets_and_says_what_is_missing(sweep, caplog):
    one_budget = [run for run in sweep if run.budget == 1e20]
    with pytest.raises(ScalingFitError, match=r"at least 2 budgets.*7 run\(s\) form 1 budget\(s\), of which 1 usable"):
        fit_isoflop(one_budget)
    two_sizes = [run for run in sweep if run.budget == 1e19][:2]
    with caplog.at_level(logging.WARNING, logger="marin.scaling.fits"):
        with pytest.raises(ScalingFitError, match=r"only 2 distinct model size\(s\)"):
            fit_isoflop(one_budget + two_sizes)
    assert "1e+19 FLOP budget" in caplog.text


def test_isoflop_fit_skips_a_downward_parabola_with_a_warning(sweep, caplog):
    hump = [_run(params, 1e21 / (6 * params), loss, budget=1e21)
            for params, loss in ((1e8, 3.0), (1e9, 3.2), (1e10, 3.0))]
    kept = [run for run in sweep if run.budget in (1e18, 1e19, 1e20)]
    with caplog.at_level(logging.WARNING, logger="marin.scaling.fits"):
        fit = fit_isoflop(kept + hump, bootstrap=0)
    assert [curve.budget for curve in fit.curves] == [1e18, 1e19, 1e20]
    assert "1e+21 FLOP budget" in caplog.text and "opens downward" in caplog.text


def test_isoflop_fit_warns_when_a_best_size_is_extrapolated(sweep, caplog):
    # Only sizes well below the best one (noise-free): losses fall all the way, the vertex lies past the largest.
    best_size, _ = TRUE.optimal(1e21)
    small = [_run(size, 1e21 / (6 * size), TRUE.loss(size, 1e21 / (6 * size)), budget=1e21)
             for size in best_size * np.array([0.05, 0.1, 0.2, 0.4])]
    kept = [run for run in sweep if run.budget != 1e21]
    with caplog.at_level(logging.WARNING, logger="marin.scaling.fits"):
        fit = fit_isoflop(kept + small, bootstrap=0)
    curve = next(curve for curve in fit.curves if curve.budget == 1e21)
    assert curve.params_opt > max(run.params for run in small)
    assert "extrapolated" in caplog.text


def test_parametric_fit_refuses_runs_that_cannot_pin_five_coefficients(sweep):
    with pytest.raises(ScalingFitError, match=r"at least 5 runs.*got 4 run\(s\)"):
        fit_parametric(sweep[:4])
    one_size = [_run(1e8, tokens, 3.0 + 1e10 / tokens) for tokens in np.geomspace(1e9, 1e11, 6)]
    with pytest.raises(ScalingFitError, match=r"1 size\(s\), 6 token count\(s\)"):
        fit_parametric(one_size)
    broken = [*sweep[:5], ScalingRun(name="diverged", params=1e8, tokens=1e9, flops=6e17, loss=float("nan"))]
    with pytest.raises(ScalingFitError, match="'diverged' has loss=nan"):
        fit_parametric(broken)


def test_fits_serialize_to_json(sweep, parametric):
    isoflop = json.loads(json.dumps(fit_isoflop(sweep, bootstrap=10).to_json()))
    assert isoflop["method"] == "isoflop" and len(isoflop["curves"]) == len(BUDGETS)
    assert len(isoflop["curves"][0]["runs"]) == 7
    record = json.loads(json.dumps(parametric.to_json()))
    assert record["alpha"]["value"] == parametric.alpha.value
    assert record["params_exponent"]["low"] == parametric.params_exponent.low
    assert record["bootstrap_refits"] == 50 and len(record["runs"]) == len(sweep)


@pytest.mark.parametrize("with_parametric", [True, False])
def test_plot_scaling_writes_a_png(sweep, parametric, tmp_path, with_parametric):
    path = str(tmp_path / "scaling.png")
    fit = fit_isoflop(sweep, bootstrap=10)
    assert plot_scaling(sweep, fit, parametric if with_parametric else None, path, title="synthetic sweep") == path
    data = (tmp_path / "scaling.png").read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000
