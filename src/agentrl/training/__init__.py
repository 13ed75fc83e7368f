"""The training service: triggers, a durable job queue, jobs in child processes, status
events, dataset loading from the logged trajectories, and the control API's /training routes."""
