"""Weight transports: trainer weights to inference servers, in place."""
