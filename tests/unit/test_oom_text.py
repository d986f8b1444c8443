"""The OOM card's words for its rules of thumb (views/text/oom.py), beside a replay verdict."""

from __future__ import annotations


def test_a_rule_the_verdict_replayed_points_to_the_verdicts_apply():
    """One way to apply a candidate: a rule of thumb the replay's winner agrees with says to
    apply that winner (which sets exactly what was replayed), not to ``set`` it on top of the
    options in force (a combination the replay never tried)."""
    from allocconf_widget.app.oom import OomRecommendation
    from allocconf_widget.core.memory.oom import Advice
    from allocconf_widget.views.text.oom import advice_action

    rule = Advice("fragmentation", "expandable_segments:True", "1.2 GiB reserved but unallocated")
    by_replay = OomRecommendation("expandable_segments:True", True, ((rule, True),))
    said = advice_action(rule, by_replay)
    assert "flight apply" in said and "%allocconf set" not in said
    by_rules = OomRecommendation("expandable_segments:True", False, ((rule, True),))
    assert "%allocconf set expandable_segments=True, then %allocconf apply" in advice_action(rule, by_rules)


def test_the_verdict_says_a_winners_peak_with_its_range_by_gpu_timing():
    import dataclasses

    from allocconf_widget.app.flight import Sureness, Verdict, VerdictOption
    from allocconf_widget.app.simulate import SimulationRow
    from allocconf_widget.core.sim.capacity import Limit
    from allocconf_widget.core.sim.settings import SimSettings
    from allocconf_widget.core.sim.simulator import simulate
    from allocconf_widget.views.text.flight import option_line
    from tests.trace_builder import TraceBuilder

    b = TraceBuilder()
    b.free(b.alloc(1 << 20))
    replayed = simulate(b.build(), SimSettings(expandable_segments=True), device_total=8 << 30)
    ranged = dataclasses.replace(replayed, peak_reserved_bytes=3 << 30,
                                 peak_reserved_range=(5 << 29, 7 << 29))
    option = VerdictOption(SimulationRow("expandable_segments:True", "expandable_segments:True", ranged))
    verdict = Verdict(limit=Limit(4 << 30, 0.5, 8 << 30), allocated_at_oom=1 << 30, winners=(option,),
                      losers=(), sureness=Sureness.SURE, fidelity=None, events=10)
    said = option_line(verdict, option)
    assert ("3.00 GiB (2.50 GiB–3.50 GiB by GPU timing) of the 4.00 GiB limit (memory fraction 0.5 "
            "of 8.00 GiB): no OOM") in said
