"""gpuwarden health-check: fast, job-aware prolog/epilog GPU node checks with Nagios exit codes."""
