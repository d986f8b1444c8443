"""A ranked candidate's reason, as the views word it (for tests that call ``recommend`` directly)."""

from __future__ import annotations

from allocconf_widget.core.sim.recommend import Candidate, Recommendation
from allocconf_widget.views.text.reasons import reason_text


def candidate_reason(recommendation: Recommendation, candidate: Candidate) -> str:
    """Why ``candidate`` ranks where it does in ``recommendation``."""
    return reason_text(candidate.kind, candidate.settings, candidate.result, recommendation.comparison)
