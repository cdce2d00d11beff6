"""The metadata DB of jobs, graphs, plans, tasks and tiles (distributed-runtime issue)."""
