"""``atlantis-supervise``: claims rows, runs each attempt in a child, keeps the leases."""
