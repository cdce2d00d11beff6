"""Op engines: numpy (the reference oracle), cupy (GPU), and vendor plugins."""
