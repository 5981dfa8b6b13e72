#!/usr/bin/env bash
# Builds the Debian package of the gateway with dpkg-deb: the binary, a systemd unit running
# as its own user, a commented /etc/idem/idem.toml (a conffile) and the docs.
#
#   packaging/build-deb.sh BINARY OUTDIR     # prints the path of the .deb
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:?usage: build-deb.sh BINARY OUTDIR}
out=${2:?usage: build-deb.sh BINARY OUTDIR}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
install -D -m 0755 "$bin" "$stage/usr/bin/idem"
install -D -m 0644 packaging/idem.service "$stage/lib/systemd/system/idem.service"
install -D -m 0644 packaging/idem.toml "$stage/etc/idem/idem.toml"
for doc in README.md CHANGELOG.md docs/gateway.md docs/operations.md docs/openapi.json; do
  install -D -m 0644 "$doc" "$stage/usr/share/doc/idem/$(basename "$doc")"
done
install -D -m 0644 LICENSE-MIT "$stage/usr/share/doc/idem/copyright"
cat LICENSE-APACHE >> "$stage/usr/share/doc/idem/copyright"
install -d "$stage/DEBIAN"
size=$(du -sk "$stage" | cut -f1)
cat > "$stage/DEBIAN/control" <<CONTROL
Package: idem
Version: $version
Architecture: $arch
Maintainer: The idem developers <idem@example.invalid>
Installed-Size: $size
Depends: libc6, adduser
Section: net
Priority: optional
Description: idempotency gateway: unsafe requests take effect at most once per key
 idem sits in front of any HTTP or gRPC service and makes each request with an
 Idempotency-Key run at most once, across client retries, concurrent duplicates,
 several gateways and crashes; every retry gets the first answer back.
CONTROL
echo /etc/idem/idem.toml > "$stage/DEBIAN/conffiles"
install -m 0755 packaging/debian/postinst packaging/debian/prerm packaging/debian/postrm "$stage/DEBIAN/"
mkdir -p "$out"
deb="$out/idem_${version}_${arch}.deb"
dpkg-deb --root-owner-group --build "$stage" "$deb" >/dev/null
echo "$deb"
