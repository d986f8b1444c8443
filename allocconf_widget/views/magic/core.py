"""The lifecycle subcommands of ``%allocconf``: show, set, unset, apply, reset, forget, snippet, restart.

Each handler prints what a user needs to read and returns the object it
produced (configuration, apply result …), which keeps them testable from
IPython's test shell. Printing goes through ``print`` so it works the same in
a notebook, a terminal and a headless runner.
"""

from __future__ import annotations

import argparse
import sys
from typing import IO, TYPE_CHECKING, Any

from allocconf_widget._errors import AllocConfError, printable
from allocconf_widget.app.draft_prediction import predict_staged
from allocconf_widget.app.restore import Restored
from allocconf_widget.app.session import Phase, SaveScope
from allocconf_widget.core.config.conf import parse_conf
from allocconf_widget.core.config.envvars import snippets, variable_to_write
from allocconf_widget.core.config.tokens import C_WHITESPACE_TEXT
from allocconf_widget.views.text.forecast import draft_lines

if TYPE_CHECKING:
    from allocconf_widget.app.restart import RestartRequest
    from allocconf_widget.app.restore import RestoreOutcome
    from allocconf_widget.app.session import SaveOutcome, Session
    from allocconf_widget.core.config.conf import AllocConf
    from allocconf_widget.views.magic.context import MagicContext, SubParsers


def register(subparsers: SubParsers) -> None:
    """Add the lifecycle subcommands to the magic's parser."""
    add = subparsers.add_parser
    p = add("panel", help="show the control panel (the default)")
    p.set_defaults(handler=run_panel)
    p = add("show", help="runtime state, requested and effective settings, variables")
    p.set_defaults(handler=run_show)
    p = add("set", help="validate and stage settings: k=v [k=v ...] or \"<conf string>\"",
            description="Stage settings. Before torch is imported they go straight to the "
            "environment, so `%allocconf set max_split_size_mb=256 expandable_segments=True` "
            "followed by `import torch` just works; later, run `%allocconf apply`. A value of "
            "`default` unsets an option.")
    p.add_argument("settings", nargs="+", help="k=v pairs, or one configuration string")
    p.add_argument("--replace", action="store_true",
                   help="replace the whole staged configuration instead of merging")
    p.set_defaults(handler=run_set)
    p = add("unset", help="stage options back to torch's defaults")
    p.add_argument("options", nargs="+")
    p.set_defaults(handler=run_unset)
    p = add("apply", help="apply the staged settings now (the right way for this runtime) and save them "
            "for this project")
    p.add_argument("--no-save", action="store_true", help="do not save them for kernel restarts")
    p.add_argument("--global", dest="global_", action="store_true",
                   help="save them as the global default (for projects without settings of their "
                   "own) instead of for this project")
    p.set_defaults(handler=run_apply)
    p = add("reset", help="stage torch's defaults (unset every option); --apply to apply at once")
    p.add_argument("--apply", action="store_true")
    p.set_defaults(handler=run_reset)
    p = add("discard", help="drop staged changes, back to what is in effect")
    p.set_defaults(handler=run_discard)
    p = add("forget", help="delete this project's saved settings (new kernels use the global default, "
            "else torch's defaults)")
    p.add_argument("--global", dest="global_", action="store_true",
                   help="delete the global default instead")
    p.set_defaults(handler=run_forget)
    p = add("snippet", help="copyable %%env / os.environ / export lines for the staged settings")
    p.set_defaults(handler=run_snippet)
    p = add("restart", help="save the settings and restart the kernel the way this front end allows")
    p.set_defaults(handler=run_restart)


# ---------------------------------------------------------------- handlers
def run_panel(_args: argparse.Namespace, ctx: MagicContext) -> Any:
    """Show the control panel (text summary outside a notebook front end)."""
    from allocconf_widget.views.widgets.panel import show_panel

    return show_panel(ctx.session)


def run_show(_args: argparse.Namespace, ctx: MagicContext) -> dict[str, Any]:
    from allocconf_widget.app.show import settings_report

    report = settings_report(ctx.session)
    state, current, check, saved = report.state, report.requested, report.readback, report.saved
    print(f"Runtime:   {state.describe()}")
    print(f"Requested: {current.to_string() or '(torch defaults)'}"
          f"   [from {state.env.source}]")
    if report.staged is not None:
        print(f"Staged:    {report.staged.to_string() or '(torch defaults)'}  "
              "(not applied: %allocconf apply)")
    for name, value in state.env.set_vars.items():
        print(f"  {name}={_shown_value(value)}")
    for line in state.env.related_lines():
        print(f"  {line}")
    for problem in state.env.problems:
        print(f"  problem: {problem}")
    if check is None and state.phase is Phase.NO_CUDA:
        print("Effective: none: this torch build has no CUDA, so no CUDA allocator reads them "
              "(they are checked against its rules all the same)")
    elif check is None:
        print("Effective: not readable yet: torch reads the settings when CUDA starts")
    else:
        print(f"Effective: {check.summary()}")
    print(f"Saved:     {saved.conf.to_string() or '(defaults)'} as {saved.describe_source()}" if saved
          else "Saved:     nothing for this project (apply saves)")
    for note in report.saved_problems:
        print(f"  problem: {printable(note, 400)}")
    return {"state": state, "requested": current, "readback": check, "saved": saved}


def _parse_settings(items: list[str]) -> tuple[dict[str, str | None], str | None, dict[str, str]]:
    """``k=v`` / ``k:v`` pairs → options; one ``a:1,b:2`` string (no ``=``) is a whole configuration.

    A ``k=v`` value is never pasted into a string: :meth:`Session.update` validates each value
    on its own. One item with a ``,`` between options (``k=0.6,backend:x``, a blog's string) is
    read as a configuration string, so the error is the configuration parser's, the one
    ``allocconf check`` gives ("uses '=' between option and value … write k:0.6"). The third
    item maps each name to the separator typed after it, so a message quotes the setting as it
    was typed.
    """
    if not items or not any(item.strip() for item in items):
        raise AllocConfError("nothing to set", fix="write %allocconf set name=value, e.g. "
                             "%allocconf set expandable_segments=True")
    item = items[0]
    if len(items) == 1 and (("=" not in item and ("," in item or "[" in item))
                            or _commas_between_options(item)):
        # a configuration string, ':' or (pasted from a blog) '=' between option and value: the
        # configuration parser says what is wrong, as `allocconf check` does for the same string
        return {}, item, {}
    options: dict[str, str | None] = {}
    typed_with: dict[str, str] = {}
    for item in items:
        sep = "=" if "=" in item else ":" if ":" in item else None
        if sep is None:
            raise AllocConfError(f"{item!r} is not key=value", option=item,
                                 fix=f"write {item}=<value>, or {item}=default to unset it")
        name, _, value = item.partition(sep)
        # strip only what torch calls whitespace: a pasted no-break space must reach the parser
        name, value = name.strip(C_WHITESPACE_TEXT), value.strip(C_WHITESPACE_TEXT)
        given = None if value in ("default", "unset") else value
        if name in options and options[name] != given:  # the last one silently won
            raise AllocConfError(f"{name} is given twice ({options[name] or 'default'} and "
                                 f"{given or 'default'})", option=name,
                                 fix=f"give it once, e.g. {name}{sep}{value}")
        options[name] = given
        typed_with[name] = sep
    return options, None, typed_with


def _commas_between_options(item: str) -> bool:
    """Whether ``item`` has a ``,`` outside brackets (``a=1,b:2``), i.e. several options; a band
    list (``roundup_power2_divisions=[256:1,512:2]``) is one value."""
    depth = 0
    for char in item:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth <= 0:
            return True
    return False


def run_set(args: argparse.Namespace, ctx: MagicContext) -> Any:
    from allocconf_widget.core.config.envvars import strip_variable_prefix

    session = ctx.session
    items = list(args.settings)
    if len(items) > 1 and items[0] in ("%env", "export"):  # a whole line pasted from a blog post
        items = items[1:]  # its NAME=value part is handled below as a pasted variable
    state = session.state()
    invalid = "" if args.replace else _env_text(
        {p.variable: state.env.set_vars[p.variable] for p in state.env.problems
         if p.code == "invalid" and p.variable in state.env.set_vars})
    pasted, value = strip_variable_prefix(" ".join(items))
    replace = args.replace
    before = session.staged().to_string() if pasted is not None else ""
    if pasted is not None:  # a pasted `PYTORCH_CUDA_ALLOC_CONF=a:1`: the name is not an option
        # a whole variable is a whole configuration: it replaces what was staged (merged, an
        # earlier max_split_size_mb:256 stayed and then drew a warning about the mix)
        replace = True
        items = [value]
    options, whole, typed_with = _parse_settings(items)
    if whole is not None:
        conf = parse_conf(whole, session.state().version, warn=False)
        staged = session.stage(conf if replace else session.staged().merge(conf))
        for warning in conf.warnings:  # the string's own (an option given twice): merging drops them
            if warning not in staged.warnings:
                print(f"warning: {warning}")
    elif replace:
        staged = session.update(options, base=parse_conf("", session.state().version, warn=False),
                                typed_with=typed_with)
    else:
        staged = session.update(options, typed_with=typed_with)
    if pasted is not None:  # said once it worked: before, a value that failed still "replaced"
        print(f"note: dropped the variable name {pasted}= and staged its value as the whole "
              "configuration" + (f", replacing the staged {before}" if before else ""))
    elif invalid:  # the exported value was never merged: its options vanished without a word
        print(f"note: {invalid} was not valid, so none of it was kept; set its options again "
              "(with ':' or '=' here) if you want them")
    _report_staged(session, staged, dict(state.env.set_vars))
    return staged


def run_unset(args: argparse.Namespace, ctx: MagicContext) -> Any:
    before = dict(ctx.session.state().env.set_vars)
    staged = ctx.session.update(dict.fromkeys(args.options))
    _report_staged(ctx.session, staged, before)
    return staged


def _report_staged(session: Session, staged: AllocConf, env_before: dict[str, str] | None = None) -> None:
    """Say what staging did; ``env_before``: the variables before it, so every one it removed
    is named (torch's defaults remove each variable torch reads, not only the one it writes)."""
    _print_warnings(staged)
    state = session.state()
    if state.phase is Phase.NOT_IMPORTED:
        variable = variable_to_write(state.version, state.env.set_vars)
        result = session.last_apply
        name = result.variable if result else variable
        gone = [n for n in (env_before or {}) if n not in state.env.set_vars]
        if staged.to_string():
            print(f"{name}={staged.to_string()!r} set in the environment: torch will read it "
                  "when CUDA starts (%allocconf apply also saves it for kernel restarts).")
        else:  # every option unset: the variables are removed, not set to ''
            print(f"{' and '.join(gone) or name} removed from the environment: torch's defaults "
                  "apply when CUDA starts (%allocconf apply also saves that for kernel restarts).")
        for problem in state.env.problems:  # another variable the user set by hand (%env) is
            if problem.misread:  # now unread, or splits the keys
                print(f"note: {printable(problem.message, 300)}")
    else:
        # the plans say what apply *would* do: "applied now" read as done (a GPU test believed it)
        print(f"Staged, not applied yet: {staged.to_string() or '(torch defaults)'}")
        plans = session.preview()
        if plans:
            print("What %allocconf apply would do:")
        for plan in plans:
            print(f"  {plan}")
        print("Run %allocconf apply to apply it.")
    prediction = predict_staged(session)  # only once the user's step was recorded or dry-run
    if prediction is not None:
        for line in draft_lines(prediction):
            print(line)


def _print_warnings(conf: Any) -> None:
    for warning in conf.warnings:
        print(f"warning: {warning}")


def run_apply(args: argparse.Namespace, ctx: MagicContext) -> Any:
    if args.no_save and getattr(args, "global_", False):  # --global was silently ignored
        raise AllocConfError("--no-save and --global contradict each other (--global says where "
                             "to save)", fix="drop one: %allocconf apply --global saves the global default")
    scope: SaveScope | None = None if args.no_save else "global" if getattr(args, "global_", False) \
        else "project"
    outcome = ctx.session.apply(save=scope)
    for line in outcome.lines():
        print(line)
    return outcome.result


def run_reset(args: argparse.Namespace, ctx: MagicContext) -> Any:
    before = dict(ctx.session.state().env.set_vars)
    staged = ctx.session.stage(parse_conf("", ctx.session.state().version, warn=False))
    if args.apply:
        print("Staged torch's defaults (every option unset).")
        return run_apply(argparse.Namespace(no_save=False, global_=False), ctx)
    # before torch is imported staging writes the environment (as set does): said as set says it,
    # not as "staged" (discard cannot take back what is already in the environment)
    _report_staged(ctx.session, staged, before)
    return staged


def run_discard(_args: argparse.Namespace, ctx: MagicContext) -> None:
    if not ctx.session.has_staged_changes:  # "dropped" read as undone; nothing was
        print("Nothing staged to drop: the settings in effect stay (before torch is imported, set "
              "and reset write the environment at once; %allocconf show says what is in effect).")
        return
    ctx.session.discard()
    print("Staged changes dropped.")


def run_forget(args: argparse.Namespace, ctx: MagicContext) -> bool:
    scope: SaveScope = "global" if getattr(args, "global_", False) else "project"
    try:
        outcome = ctx.session.forget(scope)
    except OSError as exc:
        raise AllocConfError(f"the saved settings cannot be removed: {exc}",
                             fix="remove the file by hand, or set XDG_CONFIG_HOME elsewhere") from None
    print(outcome.message())
    return outcome.removed


def run_snippet(_args: argparse.Namespace, ctx: MagicContext) -> dict[str, str]:
    state = ctx.session.state()
    conf = ctx.session.staged(state)
    variable = variable_to_write(state.version, state.env.set_vars)
    snips = snippets(conf.to_string(), variable)
    print(f"# In a notebook cell, before `import torch`:\n{snips['magic']}\n")
    print(f"# In Python, before `import torch`:\n{snips['python']}\n")
    print(f"# In a shell, before starting Python:\n{snips['shell']}")
    return snips


def run_restart(_args: argparse.Namespace, ctx: MagicContext) -> RestartRequest:
    from allocconf_widget.app.restart import save_and_restart

    def before(conf: AllocConf, saved: SaveOutcome, dropped_edits: bool) -> None:
        if dropped_edits:
            print("Staged edits that were never applied are not carried over "
                  "(%allocconf apply first to keep them).")
        print(f"Saved {conf.to_string() or '(torch defaults)'} to {saved.path}; "
              "run %load_ext allocconf_widget first in the new kernel to re-apply it.")

    request = save_and_restart(ctx.session, notify=lambda line: print(line, flush=True), before=before)
    print(request.restart.message, flush=True)
    return request


# ---------------------------------------------------------------- extension load
def say_settings_kept(print_to: IO[str] = sys.stdout) -> None:
    """The extension loaded again in a kernel where it re-applied the saved settings already:
    what the user set since stays, and one line says so. Never raises."""
    try:
        from allocconf_widget.app.session import get_session

        exported = _env_text(dict(get_session().state().env.set_vars))
    except Exception:  # a broken environment must not stop the extension loading
        exported = ""
    now = f"{exported} stays in effect" if exported else "torch's defaults stay in effect"
    print(f"allocconf_widget: loaded again in this kernel; {now} (saved settings are re-applied "
          "only when a new kernel loads it; %allocconf show for details).", file=print_to)


def restore_saved_settings(print_to: IO[str] = sys.stdout, session: Session | None = None,
                           ) -> RestoreOutcome | None:
    """Re-apply saved settings in a fresh kernel, before torch touches CUDA; one line of output.

    Never raises: a broken file or environment must not stop the extension (or kernel) loading.
    """
    from allocconf_widget.app.restore import restore_saved
    from allocconf_widget.app.session import get_session

    try:
        outcome = restore_saved(session if session is not None else get_session())
    except Exception as exc:
        print(f"allocconf_widget: saved settings not re-applied ({type(exc).__name__}: "
              f"{printable(str(exc), 300)})", file=print_to)
        return None
    print(f"allocconf_widget: {restore_line(outcome)}", file=print_to)
    return outcome


def restore_line(outcome: RestoreOutcome) -> str:
    """The one line ``%load_ext`` prints: what was applied, from which file, replacing what."""
    exported = _env_text(outcome.exported)
    conf_text = (outcome.conf.to_string() or "(defaults)") if outcome.conf is not None else ""
    if outcome.kind is Restored.NOTHING_SAVED:
        why = f"{'; '.join(outcome.problems)}; " if outcome.problems else ""
        now = f"{exported} from the environment applies" if outcome.exported else "torch's defaults apply"
        if outcome.env_problem is not None:  # "applies" alone read as fine; torch refuses it later
            now += f", but {outcome.env_problem}"
        return f"{why}no saved settings ({outcome.looked_in}); {now}."
    if outcome.kind is Restored.KEPT_EXPORTED:
        return (f"kept {exported} exported before the kernel started; the global default "
                f"{conf_text!r} in {outcome.source} was not applied (%allocconf apply saves settings "
                "for this project, which take precedence).")
    if outcome.kind is Restored.FAILED:
        return f"could not re-apply {outcome.source}: {outcome.error}"
    if outcome.replaced:
        replaced = f"replacing {_env_text(outcome.replaced)} exported before the kernel started"
    elif outcome.exported:
        replaced = f"the same as {exported} already set"
    else:
        replaced = "no variable was set before"
    late = ("" if outcome.phase is Phase.NOT_IMPORTED
            else f"; torch was already imported ({outcome.phase.value})")
    variable = outcome.applied.result.variable if outcome.applied is not None else "the environment"
    return (f"re-applied {conf_text!r} via {variable} from {outcome.source}; {replaced}{late}. "
            "%allocconf forget to stop.")


#: the most of a variable's value a line quotes: a 110 KB variable made a 110 KB "one line"
_SHOWN_VALUE_CHARS = 300


def _env_text(set_vars: dict[str, str]) -> str:
    return ", ".join(f"{name}={_shown_value(value)}" for name, value in set_vars.items())


def _shown_value(value: str) -> str:
    """``repr`` of a variable's value, cut to :data:`_SHOWN_VALUE_CHARS` with the rest counted."""
    if len(value) <= _SHOWN_VALUE_CHARS:
        return repr(value)
    return f"{value[:_SHOWN_VALUE_CHARS]!r}… ({len(value) - _SHOWN_VALUE_CHARS:,} more characters)"


