"""Deployment helpers: the per-site SuperNode launcher and the demo PKI script."""
