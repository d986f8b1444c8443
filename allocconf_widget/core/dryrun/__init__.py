"""What the core knows about dry runs: the GPU profiles a step is predicted for, and what every
view says about a dry-run trace."""
