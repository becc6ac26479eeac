# Sourced by bin/cross-aarch64, bin/cross-musl and bin/cross-darwin (not run on its own): what
# building the extension for another target needs from this Debian system.
# Needs `root` (the checkout) set by the sourcing script.

# cross_ruby MINOR: sets `ruby` to this system's Ruby MINOR, or exits. Debian installs
# each Ruby as ruby<minor> (the sid chroot has 3.3 as `ruby` and 3.4 beside it), and
# rbconfig.rb insists on its own version.
cross_ruby() {
  ruby=$(command -v "ruby$1" || echo ruby)
  [ "$("$ruby" -e 'print RUBY_VERSION[/\A\d+\.\d+/]')" = "$1" ] || { echo "run this with Ruby $1" >&2; exit 64; }
}

# cross_apt PACKAGE...: installs those not installed yet (root only).
cross_apt() {
  local missing=() pkg
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
}

# cross_debs ARCH DEBS_DIR DEST PACKAGE...: the ARCH twins of this system's own
# packages (same suite, same version), from the mirror apt already uses (security
# updates from its -security twin), extracted into DEST, never installed. A
# package this suite does not have is skipped.
cross_debs() {
  local arch=$1 debs=$2 dest=$3 mirror file base deb pkg
  mirror=$("$root/bin/debian-mirror")
  mkdir -p "$debs" "$dest"
  for pkg in "${@:4}"; do
    file=$(apt-cache show --no-all-versions "$pkg" 2>/dev/null | awk '/^Filename:/ { print $2; exit }' || true)
    [ -n "$file" ] || continue
    file=${file/_amd64.deb/_$arch.deb}
    base=$mirror
    [[ $file == pool/updates/* ]] && base="$mirror-security"
    deb="$debs/$(basename "$file")"
    [ -s "$deb" ] || curl -fsSL -o "$deb" "$base/$file"
    dpkg-deb -x "$deb" "$dest"
  done
}

# cross_arm64_ruby CACHE MINOR: Debian's arm64 Ruby MINOR (headers, rbconfig.rb,
# the interpreter for qemu) extracted into CACHE/root; sets `sysroot` and `archdir`
# and exports its RbConfig as RBCONFIG_<key>, which rb-sys reads instead of the
# running Ruby's when cross compiling. `ruby` (cross_ruby) must be set.
cross_arm64_ruby() {
  sysroot="$1/root"
  # libssl: RubyGems' `gem install` loads openssl (trixie renamed the package libssl3t64).
  cross_debs arm64 "$1/debs" "$sysroot" "ruby$2" "libruby$2" "ruby$2-dev" libgmp10 libcrypt1 zlib1g libyaml-0-2 \
    libffi8 libssl3 libssl3t64 libzstd1
  archdir=$(ls -d "$sysroot"/usr/lib/aarch64-linux-gnu/ruby/"$2".*)
  cross_export_rbconfig "$archdir/rbconfig.rb"
}

# cross_export_rbconfig RBCONFIG_RB: exports every key of another Ruby's
# rbconfig.rb (read by `ruby`, renamed so it does not clash with this Ruby's) as
# RBCONFIG_<key>, plus CROSS_COMPILING=yes: rb-sys then takes them instead of
# the running Ruby's.
cross_export_rbconfig() {
  local renamed pair
  renamed="$(dirname "$1")/cross_rbconfig.rb"
  sed 's/RbConfig/CrossRbConfig/g' "$1" > "$renamed"
  # Through a file: a failing Ruby then stops the script (set -e), which a process substitution would not.
  "$ruby" -e '
    load ARGV[0]
    CrossRbConfig::CONFIG.each { |key, value| print "#{key}=#{value}\0" if key.match?(/\A\w+\z/) }
    print "CROSS_COMPILING=yes\0"' "$renamed" > "$renamed.env"
  while IFS= read -r -d '' pair; do export "RBCONFIG_$pair"; done < "$renamed.env"
}
