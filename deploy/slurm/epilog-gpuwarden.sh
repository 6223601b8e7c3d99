#!/usr/bin/env bash
# gpuwarden Slurm epilog: the prolog wrapper in epilog mode (see prolog-gpuwarden.sh).
exec "$(dirname "$(readlink -f "$0")")/prolog-gpuwarden.sh" epilog
