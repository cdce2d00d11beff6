"""The compute plane: runs plans on op engines. ``local`` runs one in-process (embedded mode)."""
