"""A slider offers only values torch accepts (issue 24, item 10): both ends of every fraction
slider, for every torch release we know, parse as a valid setting."""

from __future__ import annotations

import pytest

from allocconf_widget.core.config import options as opt
from allocconf_widget.core.config.conf import parse_conf
from allocconf_widget.core.versions import parse_version

pytest.importorskip("ipywidgets")

FRACTIONS = [spec for spec in opt.OPTIONS if spec.kind is opt.Kind.FRACTION]
RELEASES = ["1.13", "2.4", "2.10", "2.13"]


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("spec", FRACTIONS, ids=lambda s: s.name)
def test_both_ends_of_a_fraction_slider_are_values_torch_accepts(spec, release):
    from allocconf_widget.views.widgets.controls import _editor_for

    version = parse_version(release)
    if version.schema_key < spec.since:
        pytest.skip(f"{spec.name} is not in torch {release}")
    slider = _editor_for(spec, version).widget
    for end in (slider.min, slider.max):
        parse_conf(f"{spec.name}:{end:.2f}", version, warn=False)  # raises on a value torch refuses
    assert slider.max - slider.min >= 0.9  # and the slider still spans the range


def test_the_threshold_slider_stops_one_step_inside_its_open_ends():
    from allocconf_widget.views.widgets.controls import _editor_for

    spec = opt.spec_for("garbage_collection_threshold")
    assert spec is not None
    slider = _editor_for(spec, parse_version("2.13")).widget
    assert (slider.min, slider.max) == (0.01, 0.99)
