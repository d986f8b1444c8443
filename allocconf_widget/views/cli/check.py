"""``allocconf check "<conf>"``: validate a configuration string for a torch release."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from allocconf_widget._errors import AllocConfError


def register(subparsers: Any) -> None:
    """Add the ``check`` subcommand."""
    parser = subparsers.add_parser(
        "check",
        help="validate a PYTORCH_CUDA_ALLOC_CONF string",
        description=(
            "Validate an allocator configuration the way torch of the given release does, and "
            "also refuse what torch accepts but misreads. Prints the canonical string and any "
            "warnings (exit 0), or the error with a fix (exit 2)."
        ),
    )
    parser.add_argument("conf", nargs="?", help="the configuration string; omit with --env")
    parser.add_argument("--torch-version", metavar="X.Y",
                        help="release to check against (default: installed torch, else newest)")
    parser.add_argument("--env", action="store_true",
                        help="check the variables set in this environment instead")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Handler: 0 valid, 2 invalid or bad arguments."""
    from allocconf_widget.core.config.conf import parse_conf
    from allocconf_widget.core.config.envvars import (
        check_environment,
        strip_variable_prefix,
        variable_to_write,
    )
    from allocconf_widget.core.versions import resolve_version

    try:
        version = resolve_version(args.torch_version)
    except AllocConfError as exc:
        return _fail(args, exc)
    if args.env:
        return _check_env(args, check_environment(os.environ, version))
    if args.conf is None:
        print("allocconf check: give a configuration string, or --env", file=sys.stderr)
        return 2
    pasted_var, text = strip_variable_prefix(args.conf)
    if pasted_var is not None:
        print(f"note: dropped the variable name {pasted_var}= and checked only its value",
              file=sys.stderr)
    try:
        conf = parse_conf(text, version, warn=False)
    except AllocConfError as exc:
        return _fail(args, exc)
    variable = variable_to_write(version, os.environ)
    if args.json:
        print(json.dumps({
            "valid": True,
            "conf": conf.to_string(),
            "torch_version": str(version),
            "variable": variable,
            "warnings": [{"code": w.code, "option": w.option, "message": w.message}
                         for w in conf.warnings],
        }))
        return 0
    print(conf.to_string())
    for warning in conf.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if not conf.to_string():
        print(f"# torch {version}: an empty string means torch's defaults. Do not export an empty "
              f"variable (it still counts as set and hides the others): unset it with  "
              f"unset {variable}", file=sys.stderr)
        return 0
    print(f"# torch {version}: set it with  export {variable}='{conf.to_string()}'",
          file=sys.stderr)
    return 0


def _fail(args: argparse.Namespace, exc: AllocConfError) -> int:
    if args.json:
        print(json.dumps({"valid": False, "error": exc.reason, "option": exc.option,
                          "position": exc.position, "fix": exc.fix}))
    else:
        print(f"error: {exc}", file=sys.stderr)
    return 2


def _check_env(args: argparse.Namespace, report: Any) -> int:
    from allocconf_widget.core.sim.native import describe_engine, engine_name

    problems = [{"code": p.code, "variable": p.variable, "message": p.message}
                for p in report.problems]
    if args.json:
        print(json.dumps(_valid_unicode({
            "torch_version": str(report.version), "set": report.set_vars,
            "generic_from": report.generic_from, "device_from": report.device_from,
            "problems": problems, "replay_engine": engine_name(),
            "replay_engine_detail": describe_engine(),
            "related": [{"name": var.name, "value": value,
                         "meaning": var.describe(value, report.version)}
                        for var, value in report.related]})))
    else:
        if not report.set_vars:
            print(f"no allocator variable is set: torch {report.version} uses its defaults")
        for name, value in report.set_vars.items():
            print(f"{name}={value!r}")
        for line in report.related_lines():
            print(line)
        print(f"replay engine: {describe_engine()}")
        for problem in report.problems:
            print(f"problem: {problem}", file=sys.stderr)
    return 2 if any(p.code == "invalid" for p in report.problems) else 0


def _valid_unicode(value: Any) -> Any:
    """``value`` with every string made valid Unicode: an environment variable holding bytes
    that are not UTF-8 reaches Python as lone surrogates (``\\udcff``), which strict JSON
    readers refuse; such a byte is written ``\\xff`` instead."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if isinstance(value, dict):
        return {_valid_unicode(k): _valid_unicode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_valid_unicode(v) for v in value]
    return value
