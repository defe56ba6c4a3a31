"""The console: templates and static assets served by the gateway under /console."""
