"""The dashboard's static files (served at /ui by service.api.routes.ui): one HTML page whose script
draws SVG from the JSON API, so nothing is loaded from outside the service."""
