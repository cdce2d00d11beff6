"""Revision files, oldest first by their ``down_revision`` chain."""
