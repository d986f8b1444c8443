"""``with allocconf_widget.dry_run() as run: ...``, then ``run.predict(conf)``.

A thin front end over :mod:`allocconf_widget.app.dryrun`: the use case runs the step and
replays it; this module hands the user an object whose :meth:`Forecast.describe` words the
prediction as every other view does (``views/text/forecast.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from allocconf_widget._errors import DryRunError
from allocconf_widget.app.dryrun import DryRunContext, DryRunResult, Prediction
from allocconf_widget.views.text.forecast import prediction_text
from allocconf_widget.views.text.progress import ProgressLine

if TYPE_CHECKING:
    from types import TracebackType

    from allocconf_widget.core.config.conf import AllocConf
    from allocconf_widget.core.dryrun.profiles import GpuProfile


@dataclass(frozen=True)
class Forecast(Prediction):
    """A :class:`~allocconf_widget.app.dryrun.Prediction` that can say itself."""

    def describe(self) -> str:
        """The setting, the GPU and what the setting does to the step, in one sentence."""
        return prediction_text(self)

    @classmethod
    def of(cls, prediction: Prediction) -> Forecast:
        return cls(**{name: getattr(prediction, name) for name in prediction.__dataclass_fields__})


class DryRun:
    """The handle ``allocconf_widget.dry_run()`` returns: a context manager, then the result
    (``predict``, ``save``, ``summary``, ``trace`` …)."""

    def __init__(self, context: DryRunContext, progress: ProgressLine | None = None) -> None:
        self._context = context
        self._progress = progress

    def __enter__(self) -> DryRun:
        self._context.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.close()
        try:
            self._context.__exit__(kind, exc, tb)
        except DryRunError as error:  # one line: the step's frames are in the message's line
            raise type(error)(str(error)).with_traceback(None) from None

    @property
    def result(self) -> DryRunResult | None:
        return self._context.result

    def predict(self, conf: str | AllocConf = "", gpu: str | GpuProfile | None = None) -> Forecast:
        """What ``conf`` would do to the step on ``gpu`` (default: the run's GPU)."""
        return Forecast.of(self._context.predict(conf, gpu))

    def __getattr__(self, name: str) -> Any:  # save, summary, snapshot, trace …
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._context, name)


def dry_run(gpu: str | GpuProfile | None = None, *, rules: bool = True, standin: bool | None = None,
            progress: bool = True) -> DryRun:
    """:func:`allocconf_widget.app.dryrun.dry_run`, as the Python API hands it over.
    ``progress``: show the ops dispatched while the block runs (after half a second)."""
    from allocconf_widget.app.dryrun import dry_run as start

    line = ProgressLine("dry run", unit="ops") if progress else None
    return DryRun(start(gpu, rules=rules, standin=standin, progress=line.update if line else None), line)
