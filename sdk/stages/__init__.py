"""Pipeline stages, by name. A team's pipeline is `DEFAULT_STAGES` in order, then the router."""
