"""Memory engines (host, device, redis, file) hold tiles."""
