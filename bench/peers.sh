#!/usr/bin/env bash
# Peers for `forkpool-bench`: Apache httpd (prefork MPM) and nginx, run from
# config files in a scratch directory (no system service is touched), bound
# to loopback only.
#
#   bench/peers.sh install   apt-get install apache2 nginx (Debian; as root)
#   bench/peers.sh start     start both (installs first if they are missing)
#   bench/peers.sh stop      stop both, by the pids they wrote
#   bench/peers.sh status    say what runs
#
# Then:  forkpool-bench --peer apache=http://127.0.0.1:8081/hello \
#                       --peer nginx=http://127.0.0.1:8082/
#
# Apache: prefork, MaxRequestWorkers 64, KeepAlive On (Apache's defaults for
# MaxKeepAliveRequests 100 and KeepAliveTimeout 5), serving a 6-byte static
# file, no access log. nginx: 2 workers, `return 200 "hello\n"`, no access
# log, on 8082, and the same with `listen ... deferred` (TCP_DEFER_ACCEPT)
# on 8083. Set FORKPOOL_PEERS_DIR to put the scratch directory elsewhere.
set -euo pipefail
# shellcheck source=lib/server.sh
. "$(dirname "$0")/lib/server.sh"

dir=${FORKPOOL_PEERS_DIR:-${TMPDIR:-/tmp}/forkpool-peers}
apache_port=8081
nginx_port=8082
nginx_deferred_port=8083
apache_modules=/usr/lib/apache2/modules

die() { echo "peers.sh: $*" >&2; exit 1; }

install() {
  if command -v apache2 >/dev/null && command -v nginx >/dev/null; then
    return
  fi
  [ "$(id -u)" = 0 ] || die "installing needs root: sudo $0 install"
  command -v apt-get >/dev/null || die "no apt-get: install Apache httpd (with mod_mpm_prefork) and nginx yourself"
  apt-get update -qq
  # Debian starts freshly installed services unless policy-rc.d says no; we
  # do not want them on ports 80/443, so stop any the package started.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq apache2 nginx
  for svc in apache2 nginx; do
    service "$svc" stop >/dev/null 2>&1 || true
  done
}

# Prints the pid in pid file $1 if that process is alive.
live_pid() {
  local pid
  [ -s "$1" ] || return 1
  pid=$(cat "$1")
  kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}


write_apache_config() {
  mkdir -p "$dir/apache/htdocs" "$dir/apache/run"
  printf 'hello\n' >"$dir/apache/htdocs/hello"
  cat >"$dir/apache/httpd.conf" <<EOF
ServerRoot "$dir/apache"
ServerName 127.0.0.1
Listen 127.0.0.1:$apache_port
LoadModule mpm_prefork_module $apache_modules/mod_mpm_prefork.so
LoadModule authz_core_module $apache_modules/mod_authz_core.so
User www-data
Group www-data
PidFile "$dir/apache/apache.pid"
DefaultRuntimeDir "$dir/apache/run"
ErrorLog "$dir/apache/error.log"
LogLevel warn
DocumentRoot "$dir/apache/htdocs"
<Directory "$dir/apache/htdocs">
    Options None
    AllowOverride None
    Require all granted
</Directory>
StartServers 5
MinSpareServers 5
MaxSpareServers 10
ServerLimit 64
MaxRequestWorkers 64
MaxConnectionsPerChild 0
KeepAlive On
MaxKeepAliveRequests 100
KeepAliveTimeout 5
EOF
}

write_nginx_config() {
  mkdir -p "$dir/nginx/logs"
  cat >"$dir/nginx/nginx.conf" <<EOF
worker_processes 2;
pid $dir/nginx/nginx.pid;
error_log $dir/nginx/error.log warn;
events {
    worker_connections 1024;
}
http {
    access_log off;
    server {
        listen 127.0.0.1:$nginx_port;
        location / {
            return 200 "hello\n";
        }
    }
    # The same with TCP_DEFER_ACCEPT, as forkpool --defer-accept does.
    server {
        listen 127.0.0.1:$nginx_deferred_port deferred;
        location / {
            return 200 "hello\n";
        }
    }
}
EOF
}

start() {
  install
  if live_pid "$dir/apache/apache.pid" >/dev/null || live_pid "$dir/nginx/nginx.pid" >/dev/null; then
    die "peers already run from $dir: $0 stop first"
  fi
  mkdir -p "$dir"
  # Apache's workers run as www-data and must reach the document root.
  chmod 755 "$dir"
  write_apache_config
  write_nginx_config
  apache2 -f "$dir/apache/httpd.conf" -k start
  nginx -p "$dir/nginx" -c "$dir/nginx/nginx.conf"
  wait_for_port "$apache_port" || die "apache did not listen on $apache_port: see $dir/apache/error.log"
  wait_for_port "$nginx_port" || die "nginx did not listen on $nginx_port: see $dir/nginx/error.log"
  echo "apache (prefork): http://127.0.0.1:$apache_port/hello  pid $(cat "$dir/apache/apache.pid")"
  echo "nginx:            http://127.0.0.1:$nginx_port/        pid $(cat "$dir/nginx/nginx.pid")"
  echo "nginx (deferred): http://127.0.0.1:$nginx_deferred_port/        same pid"
}

# Stops the server whose master pid is in $2 (named $1): SIGTERM, then
# SIGKILL to the master and its children if it has not gone in 5 s.
stop_one() {
  local name=$1 pidfile=$2 pid children tries=50
  pid=$(live_pid "$pidfile") || { echo "$name: not running"; return 0; }
  children=$(ps -o pid= --ppid "$pid" || true)
  kill -TERM "$pid"
  while kill -0 "$pid" 2>/dev/null && [ "$tries" -gt 0 ]; do
    sleep 0.1
    tries=$((tries - 1))
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "$name: pid $pid ignored SIGTERM; killing it and its children"
    kill -KILL "$pid" $children 2>/dev/null || true
  fi
  rm -f "$pidfile"
  echo "$name: stopped (pid $pid)"
}

stop() {
  stop_one apache "$dir/apache/apache.pid"
  stop_one nginx "$dir/nginx/nginx.pid"
}

status() {
  local pid
  for name in apache nginx; do
    if pid=$(live_pid "$dir/$name/$name.pid"); then
      echo "$name: running, pid $pid"
    else
      echo "$name: not running"
    fi
  done
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) die "usage: $0 install|start|stop|status" ;;
esac
