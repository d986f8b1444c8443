"""Pure core: configuration model, snapshot metrics and the allocator simulator.

Nothing in this package imports torch, IPython, ipywidgets, plotly or numpy;
ruff's banned-api rule (see pyproject.toml) keeps it that way.
"""
