"""The web dashboard, served by the scheduler; it reads the REST API only."""
