"""The HCCT figures with the authors' metric: each client's best over epochs beside the last epoch
(train.report_best, evaluated every epoch), and ``reproduce --set 'arms.*.PATH=VALUE'`` to give
every arm the authors' epoch-0 FedAvg start (``grouping.first = "global"``)."""
import pytest

from groupfel.experiments import cli, reproduce


@pytest.mark.parametrize("name", ["hcct-fig3", "hcct-fig4", "hcct-fig5", "hcct-fig6"])
def test_the_figures_report_each_clients_best_every_epoch(name):
    rep = reproduce.load(name)
    assert "local_error_best" in [m.name for m in rep.metrics]
    for config in reproduce.point_configs(rep, True):
        assert config.train.report_best and config.train.eval_every == 1


def test_set_arms_star_reaches_every_arm_of_the_base_and_of_the_arms_axis():
    over = reproduce.parse_overrides(["arms.*.grouping.first=global"])
    sweep, base, changed = reproduce.resolve(reproduce.load("hcct-fig4"), True, overrides=over)
    assert changed[-1] == "arms.*.grouping.first: -> 'global' in every arm (--set)"
    configs = reproduce.point_configs_of(sweep, base)
    assert len(configs) == 6 and all(a.grouping["first"] == "global" for c in configs for a in c.arms)
    sweep, base, _ = reproduce.resolve(reproduce.load("hcct-table4-cifar10"), True,
                                       overrides=reproduce.parse_overrides(["arms.*.grouping.init=shared"]))
    arms = [a for value in sweep["axes"]["arms"] for a in value]
    assert len(arms) == 9 and all(a["grouping"]["init"] == "shared" for a in arms)


def test_bad_arms_star_is_one_line(tmp_path, capsys):
    out = tmp_path / "o"
    assert cli.main(["reproduce", "hcct-fig4", "--quick", "--set", "arms.*.=1", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "arms.*.PATH=VALUE" in err and not out.exists()
    # a key that one of the arms' policies lacks: the run config's own one line, nothing written
    assert cli.main(["reproduce", "hcct-table4-cifar10", "--quick", "--set", "arms.*.grouping.first=global",
                     "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "first" in err and not out.exists()


def test_evaluating_every_epoch_changes_no_trained_number(tiny_dict, tmp_path):
    """The figures now evaluate every epoch (for the best); their committed last-epoch errors,
    evaluated every few epochs, stay comparable: the cadence touches no training."""
    from groupfel.emulator.config import parse_config
    from groupfel.emulator.driver import plan_arm, run_arm
    from groupfel.emulator.world import build_world

    last = {}
    for every, best in ((3, False), (1, True)):
        d = {**tiny_dict, "mode": "per-group", "topology": {"edges": 1, "clients_per_edge": 6},
             "data": {"dataset": "digits", "partition": "shards", "n_shards": 30, "sizes": "half-normal",
                      "min_samples": 10, "max_samples": 200, "mean_samples": 100, "test_fraction": 0.5},
             "arms": [{"name": "hcct", "grouping": {"policy": "hcct", "alpha": 100.0, "schedule": "alg1"}}]}
        d["train"] = {**tiny_dict["train"], "rounds": 6, "group_rounds": 1, "eval_every": every, "report_best": best}
        world = build_world(parse_config(d))
        rows = run_arm(world, plan_arm(world, 0), tmp_path / str(every))
        last[every] = rows[rows["round"] == 6][["local_error_mean", "groups_sampled", "cost"]].values.tolist()
    assert last[1] == last[3]
