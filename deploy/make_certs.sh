#!/usr/bin/env bash
# Demo PKI for a Flower 1.39 deployment (NOT for production: keys are unencrypted).
#
#   deploy/make_certs.sh OUT_DIR [SUPERLINK_HOST ...] [--nodes site-a,site-b,...]
#
# Writes into OUT_DIR:
#   ca.crt, ca.key                  a self-signed demo CA (give ca.crt to every SuperNode and CLI user)
#   server.pem, server.key          the SuperLink's TLS certificate, signed by the CA; its SANs are
#                                   localhost, 127.0.0.1, ::1 and every SUPERLINK_HOST given
#                                   (DNS names or IP addresses the SuperNodes dial)
#   superexec.secret                the SuperExec auth secret (process isolation, docker/)
#   keys/<site>, keys/<site>.pub    one SuperNode authentication key pair per site: ECDSA P-384 in
#                                   OpenSSH format (what `flower-supernode --auth-supernode-private-key`
#                                   and `flwr supernode register` read in 1.39)
set -euo pipefail

if [[ $# -lt 1 ]]; then
  sed -n 2,15p "$0"
  exit 2
fi
OUT="$1"; shift
HOSTS=()
NODES=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) NODES="$2"; shift 2 ;;
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
  openssl req -x509 -newkey rsa:2048 -sha256 -days 365 -nodes \
    -keyout ca.key -out ca.crt -subj "/CN=pflower-demo-ca" 2>/dev/null
fi

openssl req -newkey rsa:2048 -sha256 -nodes -keyout server.key -out server.csr \
  -subj "/CN=pflower-superlink" 2>/dev/null
cat > server.ext <<EXT
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=$SAN
EXT
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
  -out server.pem -days 365 -sha256 -extfile server.ext 2>/dev/null
rm -f server.csr server.ext ca.srl
# shared secret between the SuperLink/SuperNode and their SuperExec in `--isolation process`
[[ -f superexec.secret ]] || openssl rand -hex 32 | tr -d '\n' > superexec.secret
chmod 600 ca.key server.key superexec.secret

IFS=',' read -r -a SITES <<< "$NODES"
for site in "${SITES[@]+"${SITES[@]}"}"; do
  [[ -z "$site" ]] && continue
  if [[ ! -f "keys/$site" ]]; then
    ssh-keygen -q -t ecdsa -b 384 -N "" -C "$site" -f "keys/$site"
  fi
done

echo "CA:        $OUT/ca.crt"
echo "SuperLink: $OUT/server.pem $OUT/server.key (SAN $SAN)"
for site in "${SITES[@]+"${SITES[@]}"}"; do
  [[ -n "$site" ]] && echo "SuperNode: $OUT/keys/$site (register $OUT/keys/$site.pub)"
done
