"""Use cases: what the CLI, the magic and the widgets do, with typed inputs and results.

Views parse input and render what these return; they never call one another.
"""
