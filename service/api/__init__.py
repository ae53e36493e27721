"""The HTTP API: the app, its routes and dependencies, security, the dashboard."""
