"""Apply a replayed candidate: the one use case behind every "Apply this setting" button.

A What-if row, the OOM card's verdict and ``%allocconf flight apply`` all offer a setting the
replay ranked. Applying one is not "stage this string": the kernel may run options the
replay does not model (pinned host memory, the cudaMalloc lock, graph-capture reuse), and
dropping them behind the user's back loses settings they chose. So every front end asks
:func:`plan_candidate` first — the complete configuration Apply will make, what it sets, what it
unsets, what it keeps, and whether the candidate came from a recording that is not this
kernel's — shows that, asks when :attr:`CandidatePlan.needs_confirmation`, and then calls
:func:`apply_candidate`, which goes through :meth:`Session.apply` like every other Apply and
returns its :class:`~allocconf_widget.app.session.ApplyOutcome`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from allocconf_widget.app.session import ApplyOutcome, Session
from allocconf_widget.core.config.conf import AllocConf, Change, format_value, parse_conf
from allocconf_widget.core.config.options import spec_for
from allocconf_widget.core.versions import TorchVersion

#: Options a replay says nothing about (host memory, locking, graph capture): Apply keeps them
#: as they are rather than unsetting them behind the user's back.
NOT_REPLAYED = ("release_lock_on_cudamalloc", "graph_capture_record_stream_reuse")


def _replayed(name: str) -> bool:
    return not (name.startswith("pinned_") or name in NOT_REPLAYED)


@dataclass(frozen=True)
class CandidatePlan:
    """What applying one replayed candidate would do to this kernel's configuration."""

    conf: str  # the candidate's string ("" = torch's defaults)
    target: AllocConf  # the complete configuration Apply will make
    changes: tuple[Change, ...]  # in canonical order
    kept: tuple[str, ...]  # options the replay does not model, carried over unchanged
    #: None: replayed from this kernel's own recording; else what it was replayed from
    #: (a recording of another run): Apply says so and asks first
    foreign_source: str | None = None
    #: a staged draft, not applied, that Apply replaces (it was dropped without a word)
    replaces_draft: str | None = None

    @property
    def shown_conf(self) -> str:
        return self.conf or "torch's defaults"

    @property
    def sets(self) -> tuple[str, ...]:
        return tuple(f"{c.option}:{format_value(c.after)}" for c in self.changes if c.after is not None)

    @property
    def unsets(self) -> tuple[str, ...]:
        return tuple(f"{c.option}:{format_value(c.before)}" for c in self.changes
                     if c.after is None and c.before is not None)

    @property
    def needs_confirmation(self) -> bool:
        """Ask before applying: it unsets something, it was replayed from another run, or it
        replaces a draft the user staged."""
        return bool(self.changes) and (bool(self.unsets) or self.foreign_source is not None
                                       or self.replaces_draft is not None)

    def describe(self) -> str:
        """One sentence for the confirm step: what will be set, unset, kept and replaced, and
        that it is saved (every Apply is: ``%load_ext`` re-applies it in a new kernel)."""
        if not self.changes:
            return "this kernel already runs these settings: nothing to change"
        text = "Apply will " + self._sentence("set", "unset", "keeps")
        if self.replaces_draft is not None:
            text += (f"; it replaces your staged draft {self.replaces_draft or '(torch defaults)'}, "
                     "which is not applied")
        text += "; it is saved for this project and re-applied in new kernels"
        if self.foreign_source is not None:
            text = (f"replayed from {self.foreign_source}, not from this kernel's own run: "
                    f"{text[0].lower()}{text[1:]}")
            text = text[0].upper() + text[1:]
        return text

    def done(self) -> str:
        """The same sentence once applied: what was set and what was unset."""
        if not self.changes:
            return "This kernel already ran these settings: nothing changed"
        text = self._sentence("set", "unset", "kept")
        return text[:1].upper() + text[1:]

    def _sentence(self, set_verb: str, unset_verb: str, keep_verb: str) -> str:
        parts = []
        if self.sets:
            parts.append(f"{set_verb} " + ", ".join(self.sets))
        if self.unsets:
            parts.append(f"{unset_verb} " + ", ".join(self.unsets))
        text = " and ".join(parts)
        if self.kept:
            text += f"; {keep_verb} {', '.join(self.kept)} (the replay does not model them)"
        return text


def plan_candidate(base: AllocConf, conf: str, *, foreign_source: str | None = None) -> CandidatePlan:
    """The complete configuration applying ``conf`` makes from ``base`` (what this kernel applied).

    The candidate's options replace the memory options; options the replay does not model
    are kept.

    Raises:
        AllocConfError: the candidate is not valid for the kernel's torch.
    """
    row = _row_conf(conf, base.torch_version)
    kept = {name: value for name, value in base.items()
            if not _replayed(name) and name not in row and spec_for(name) is not None}
    target = base.without(*(name for name, _ in base.items() if name not in kept)).merge(row) if kept else row
    return CandidatePlan(conf, target, base.diff(target), tuple(kept), foreign_source)


@functools.lru_cache(maxsize=128)
def _row_conf(conf: str, version: TorchVersion) -> AllocConf:
    """A ranked row's option string for the kernel's torch, parsed once per string and release
    (rows are planned again at every change of the session)."""
    return parse_conf(conf, version, warn=False)


def plan_for_session(session: Session, conf: str, *, foreign_source: str | None = None) -> CandidatePlan:
    """:func:`plan_candidate` from what ``session`` applied (read now), naming a staged draft
    that Apply would replace."""
    view = session.view()
    plan = plan_candidate(view.applied, conf, foreign_source=foreign_source)
    staged = view.staged.to_string()
    if staged != view.applied.to_string() and staged != plan.target.to_string():
        plan = replace(plan, replaces_draft=staged)
    return plan


def apply_candidate(session: Session, plan: CandidatePlan) -> ApplyOutcome:
    """Apply ``plan`` through the Session (the right way for this runtime), save and read back.

    The plan is re-made from what the kernel runs *now*, so an Apply elsewhere between the
    question and the click is never undone by an old plan.

    Raises:
        AllocConfError: the candidate is not valid for the kernel's torch.
        RuntimeError: torch's runtime setter refused it.
    """
    fresh = plan_for_session(session, plan.conf, foreign_source=plan.foreign_source)
    return session.apply(fresh.target, candidate=fresh)
