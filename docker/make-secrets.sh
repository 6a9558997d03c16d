#!/usr/bin/env bash
# Writes the secret files docker/compose.yml (and compose.postgres.yml) read, each with a fresh random value,
# in a folder only you can enter: api_token, metrics_token, and one broker password in broker_url, rabbitmq_api and
# rabbitmq.conf; one PostgreSQL password in postgres_password and database_url; the folder is yours only (0700).
# See docs/deployment.md.
#   bash docker/make-secrets.sh [DIR]      # DIR: docker/secrets by default (LABSWARM_SECRETS for compose)
# An existing set is never overwritten (the broker and PostgreSQL keep the password of their first start).
set -euo pipefail
dir=${1:-$(dirname "$0")/secrets}
files=(api_token metrics_token broker_url rabbitmq_api rabbitmq.conf postgres_password database_url)
for name in "${files[@]}"; do
    if [[ -e "$dir/$name" ]]; then
        echo "make-secrets: $dir/$name exists: nothing written (remove the set to make a new one)" >&2
        exit 1
    fi
done
random() { od -An -tx1 -N"$1" /dev/urandom | tr -d ' \n'; }  # hex: safe in URLs and config files
umask 077
mkdir -p "$dir"
broker=$(random 24)
postgres=$(random 24)
printf '%s' "$(random 32)" >"$dir/api_token"
printf '%s' "$(random 32)" >"$dir/metrics_token"
printf 'amqp://labswarm:%s@rabbitmq:5672//' "$broker" >"$dir/broker_url"
printf 'http://labswarm:%s@rabbitmq:15672' "$broker" >"$dir/rabbitmq_api"
printf 'default_user = labswarm\ndefault_pass = %s\n' "$broker" >"$dir/rabbitmq.conf"
printf '%s' "$postgres" >"$dir/postgres_password"
printf 'postgresql+psycopg://labswarm:%s@postgres:5432/labswarm' "$postgres" >"$dir/database_url"
# the containers run as other users (labswarm 1000, rabbitmq 999, postgres 999): docker compose bind-mounts
# these files as they are, so they must be readable there; a swarm copies them into its own secrets (0444)
chmod 0644 "$dir"/*
echo "make-secrets: wrote ${#files[@]} files to $dir; export LABSWARM_API_TOKEN_FILE=$(cd "$dir" && pwd)/api_token"
