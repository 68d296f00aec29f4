#!/usr/bin/env bash
# Demo PKI for a Flower 1.39 deployment (NOT for production: keys are unencrypted).
#
#   deploy/make_certs.sh OUT_DIR [SUPERLINK_HOST ...] [--nodes site-a,site-b,...] [--days N]
#
# Writes into OUT_DIR:
#   ca.crt, ca.key                  a self-signed demo CA (give ca.crt to every SuperNode and CLI user;
#                                   ca.key stays here, in no container)
#   server.pem, server.key          the SuperLink's TLS certificate, signed by the CA; its SANs are
#                                   localhost, 127.0.0.1, ::1 and every SUPERLINK_HOST given
#                                   (DNS names or IP addresses the SuperNodes dial)
#   superexec.secret                the server side's SuperExec auth secret (SuperLink + ServerApp)
#   keys/<site>, keys/<site>.pub    one SuperNode authentication key pair per site: ECDSA P-384 in
#                                   OpenSSH format (what `flower-supernode --auth-supernode-private-key`
#                                   and `flwr supernode register` read in 1.39)
#   secrets/<site>.secret           that site's own SuperExec secret (its SuperNode + its SuperExec)
# Certificates are valid for --days (default 365; the server's at most as long as the CA's),
# printed at the end. An existing CA is reused while valid; an expired one is refused with what
# to do.
set -euo pipefail

if [[ $# -lt 1 ]]; then
  sed -n 2,15p "$0"
  exit 2
fi
OUT="$1"; shift
HOSTS=()
NODES=""
DAYS=365
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) NODES="$2"; shift 2 ;;
    --days) DAYS="$2"; shift 2 ;;
    *) HOSTS+=("$1"); shift ;;
  esac
done

mkdir -p "$OUT/keys"
cd "$OUT"

# Subject alternative names: what the SuperNodes, the CLI and the SuperLink's own SuperExec dial.
SAN="DNS:localhost,IP:127.0.0.1,IP:::1"
for h in "${HOSTS[@]+"${HOSTS[@]}"}"; do
  if [[ "$h" =~ ^[0-9.]+$ || "$h" == *:* ]]; then SAN="$SAN,IP:$h"; else SAN="$SAN,DNS:$h"; fi
done

if [[ ! -f ca.key ]]; then
  openssl req -x509 -newkey rsa:2048 -sha256 -days "$DAYS" -nodes \
    -keyout ca.key -out ca.crt -subj "/CN=pflower-demo-ca" 2>/dev/null
elif ! openssl x509 -in ca.crt -noout -checkend 86400 >/dev/null; then
  echo "make_certs: the CA in $OUT has expired or expires within a day" \
    "($(openssl x509 -in ca.crt -noout -enddate)); move ca.crt and ca.key away to make a new" \
    "one (every site and CLI user then needs the new ca.crt)" >&2
  exit 1
fi
# a server certificate never outlives its CA
CA_LEFT=$(( ($(date -d "$(openssl x509 -in ca.crt -noout -enddate | cut -d= -f2)" +%s) - $(date +%s)) / 86400 ))
(( CA_LEFT < DAYS )) && DAYS=$CA_LEFT

openssl req -newkey rsa:2048 -sha256 -nodes -keyout server.key -out server.csr \
  -subj "/CN=pflower-superlink" 2>/dev/null
cat > server.ext <<EXT
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=$SAN
EXT
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
  -out server.pem -days "$DAYS" -sha256 -extfile server.ext 2>/dev/null
rm -f server.csr server.ext ca.srl
# shared secret between the SuperLink/SuperNode and their SuperExec in `--isolation process`
[[ -f superexec.secret ]] || openssl rand -hex 32 | tr -d '\n' > superexec.secret
chmod 600 ca.key server.key superexec.secret

IFS=',' read -r -a SITES <<< "$NODES"
mkdir -p secrets
for site in "${SITES[@]+"${SITES[@]}"}"; do
  [[ -z "$site" ]] && continue
  if [[ ! -f "keys/$site" ]]; then
    ssh-keygen -q -t ecdsa -b 384 -N "" -C "$site" -f "keys/$site"
  fi
  [[ -f "secrets/$site.secret" ]] || openssl rand -hex 32 | tr -d '\n' > "secrets/$site.secret"
  chmod 600 "secrets/$site.secret"
done

echo "CA:        $OUT/ca.crt, $(openssl x509 -in ca.crt -noout -enddate)"
echo "SuperLink: $OUT/server.pem $OUT/server.key (SAN $SAN), $(openssl x509 -in server.pem -noout -enddate)"
for site in "${SITES[@]+"${SITES[@]}"}"; do
  [[ -n "$site" ]] && echo "SuperNode: $OUT/keys/$site (register $OUT/keys/$site.pub), secret $OUT/secrets/$site.secret"
done
