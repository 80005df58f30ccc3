#!/bin/sh
# One snapshot of the etcd cluster that holds Ballast's running intent: saved from the local
# member, checked, kept here (the newest $KEEP) and copied off this host to $BACKUP. Run by
# ballast-etcd-snapshot.service (its timer); settings in /etc/default/ballast-etcd-snapshot:
#   ETCDCTL_API, ETCDCTL_ENDPOINTS, ETCDCTL_CACERT, ETCDCTL_CERT, ETCDCTL_KEY  etcdctl's own
#   NAME       this host's name, in the file name
#   SNAPSHOTS  the local directory (root only)
#   BACKUP     HOST:DIR to copy each snapshot to (scp, root's SSH key)
#   KEEP       how many snapshots to keep locally
# Restore: deploy/README.md, "Restore etcd from a snapshot".
set -eu
: "${NAME:?}" "${SNAPSHOTS:?}" "${BACKUP:?}" "${KEEP:=48}"
umask 077
mkdir -p "$SNAPSHOTS"
file="etcd-$NAME-$(date -u +%Y%m%dT%H%M%SZ).db"
etcdctl snapshot save "$SNAPSHOTS/$file" >/dev/null   # written as $file.part, then renamed
etcdctl --write-out=table snapshot status "$SNAPSHOTS/$file"
scp -q -o BatchMode=yes "$SNAPSHOTS/$file" "$BACKUP/$file"
echo "saved $SNAPSHOTS/$file, copied to $BACKUP/$file"
ls -1t "$SNAPSHOTS"/etcd-*.db | tail -n +"$((KEEP + 1))" | while read -r old; do rm -f -- "$old"; done
