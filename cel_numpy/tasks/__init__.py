"""Template-generated tasks (no downloads); see `cel_numpy.tasks.base` for the contract."""
