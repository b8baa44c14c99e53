"""``telescope plugins``: every registered name, its kind and the package that provides it."""

from __future__ import annotations

import json

import click


@click.command(name="plugins")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def plugins_command(as_json: bool) -> None:
    """List registered plugins (name, kind, distribution, version, status) and load errors.

    A name that two packages register is listed once per package, marked CLASH: it
    cannot be used until one package is uninstalled or blocked.
    """
    from telescope.plugins.manager import get_plugin_manager
    from telescope.plugins.registry import PluginEntry

    manager = get_plugin_manager()
    registry = manager.registry

    def row(e: PluginEntry, clash: bool) -> dict[str, str]:
        return {
            "name": e.name,
            "kind": e.kind.label,
            "distribution": e.distribution or "-",
            "version": e.version or "-",
            "plugin": e.plugin,
            "status": "CLASH: registered twice, unusable" if clash else "ok",
        }

    rows = [row(e, False) for e in registry] + [row(e, True) for e in registry.clashes()]
    rows.sort(key=lambda r: (r["kind"], r["name"], r["distribution"]))
    failures = [
        {"plugin": f.name, "distribution": f.distribution, "version": f.version, "error": f.error}
        for f in manager.load_failures
    ]
    if as_json:
        click.echo(json.dumps({"plugins": rows, "load_errors": failures}, indent=2))
        return
    headers = ("NAME", "KIND", "DISTRIBUTION", "VERSION", "STATUS")
    keys = ("name", "kind", "distribution", "version", "status")
    widths = [max([len(h)] + [len(r[k]) for r in rows]) for h, k in zip(headers, keys, strict=True)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for r in rows:
        click.echo("  ".join(r[k].ljust(w) for k, w in zip(keys, widths, strict=True)).rstrip())
    if failures:
        click.echo("\nplugins that failed to load:")
        for f in manager.load_failures:
            click.echo(f"  {f.message}")
