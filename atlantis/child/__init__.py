"""The process a handler runs in. Started by the supervisor; never touches its connections."""
