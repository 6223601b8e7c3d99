#!/usr/bin/env bash
# gpuwarden Slurm HealthCheckProgram: the prolog wrapper in periodic mode (see prolog-gpuwarden.sh).
#   HealthCheckProgram=/usr/local/sbin/healthcheck-gpuwarden.sh
#   HealthCheckInterval=300
#   HealthCheckNodeState=ANY,CYCLE
exec "$(dirname "$(readlink -f "$0")")/prolog-gpuwarden.sh" periodic
