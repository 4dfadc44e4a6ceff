#!/usr/bin/env bash
# Puts mimalloc 2.0.9's source, with mnemosyne's patches
# (subprojects/mimalloc/patches/) applied, in subprojects/mimalloc/source/,
# where subprojects/mimalloc/meson.build builds it. Run by meson setup (meson.build) on every
# configure, and by scripts/setup.sh; quick when the tree is already there.
#
# The source is checked by its content, whatever it came from: the git tree
# of upstream's tag v2.0.9 (commit 28cf67e5b64c704cad993c71f29a24e781bee544)
# without bin/, doc/, docs/ and ide/ (the four folders Debian's +ds tarball
# leaves out; every other file is the same) must be tree
# d0d7a2705a1e0060a122e956a2575fc90614edcc. Where git is missing, only
# Debian's tarball is accepted, by its SHA-256.
#
# Where the source comes from: the first of these that gives it.
#   present   a copy an earlier run verified (subprojects/packagecache/
#             mimalloc-2.0.9/), or a tarball put in subprojects/packagecache/
#             (or subprojects/packagefiles/): Debian's
#             mimalloc_2.0.9+ds.orig.tar.xz, upstream's mimalloc-2.0.9.tar.gz
#             or v2.0.9.tar.gz
#   given     --source: a directory (a checkout), a tarball, a git
#             repository or bundle, or a URL (a tarball or git)
#   debian    Debian's source package (apt-get source mimalloc=2.0.9+ds-2,
#             with private apt lists: no root, the system's apt untouched)
#   upstream  git, that commit, from upstream's repository on GitHub (or
#             --upstream URL)
# --sources names the ones to try, in order (default
# present,given,debian,upstream). When none gives it, one message says what
# to fetch and where to put it, and the script exits 1. (Options, not
# environment variables: MNEMOSYNE_* are the library's, which warns about
# names it does not know.)
#
# Usage: scripts/fetch-mimalloc.sh [--source PATH|URL] [--upstream URL] [--sources LIST]
set -euo pipefail
given="" upstream="" order_list=present,given,debian,upstream
while [ $# -gt 0 ]; do
  case "$1" in
    --source) given=${2:?--source needs a path or URL}; shift 2 ;;
    --upstream) upstream=${2:?--upstream needs a URL}; shift 2 ;;
    --sources) order_list=${2:?--sources needs a list}; shift 2 ;;
    *) echo "usage: scripts/fetch-mimalloc.sh [--source PATH|URL] [--upstream URL] [--sources LIST]" >&2
       exit 2 ;;
  esac
done

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
say() { printf 'setup: %s\n' "$*" >&2; }

commit=28cf67e5b64c704cad993c71f29a24e781bee544
full_tree=4ccfa59473b702cd8059a2cb7c7d474f2b7d3140
tree=d0d7a2705a1e0060a122e956a2575fc90614edcc
debian_tarball=mimalloc_2.0.9+ds.orig.tar.xz
debian_sha256=cbc9d207ff105ad1f0cb739c378076143a6452b8d0624309cea0abfb040e972b
upstream_repo=https://github.com/microsoft/mimalloc.git
upstream=${upstream:-$upstream_repo}
upstream_tarball=https://github.com/microsoft/mimalloc/archive/refs/tags/v2.0.9.tar.gz
# mnemosyne's changes, in the order they apply (each explained at its top).
patches=(arena-is-zero huge-calloc os-hooks embedder-load huge-commit)

pkgfiles="$root/subprojects/packagefiles"
pkgcache="$root/subprojects/packagecache"
pristine="$pkgcache/mimalloc-2.0.9"
patchdir="$root/subprojects/mimalloc/patches"
dest="$root/subprojects/mimalloc/source"
stamp_name=.mnemosyne-source

# What the patched tree is made of: the source and the patches; a change to
# a patch remakes the tree.
recipe() {
  (cd "$patchdir" && for p in "${patches[@]}"; do cat "mimalloc-$p.patch"; done) |
    sha256sum | cut -d' ' -f1
}
want="$tree $(recipe)"
if [ -f "$dest/$stamp_name" ] && [ "$(cat "$dest/$stamp_name")" = "$want" ]; then
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
have_git=0
command -v git >/dev/null && have_git=1
reasons=()

tree_of() {  # dir: its content's git tree id
  local g="$work/tree-git"
  rm -rf "$g"
  git --git-dir="$g" init -q
  git --git-dir="$g" --work-tree="$1" -c core.autocrlf=false -c core.fileMode=true add -A -f .
  git --git-dir="$g" --work-tree="$1" write-tree
  rm -rf "$g"
}

# Takes an unpacked source in $1 (upstream's whole tree or Debian's), leaves
# it as Debian's layout and accepts it when its content is the one wanted.
accept_tree() {  # dir, what (for messages)
  local dir=$1 what=$2 got
  if [ $have_git -eq 0 ]; then
    reasons+=("$what: git is needed to check it (only Debian's tarball is checked without git)")
    return 1
  fi
  rm -rf "$dir/bin" "$dir/doc" "$dir/docs" "$dir/ide"
  got=$(tree_of "$dir")
  if [ "$got" != "$tree" ]; then
    reasons+=("$what: not mimalloc v2.0.9 (content tree $got, not $tree)")
    return 1
  fi
  keep_pristine "$dir" "$what"
}

# Keeps a checked source as the copy later runs start from.
keep_pristine() {  # dir, what (for messages)
  rm -rf "$pristine.partial"
  mkdir -p "$pkgcache"
  cp -a "$1" "$pristine.partial"
  echo "$tree" >"$pristine.partial/$stamp_name"
  rm -rf "$pristine"
  mv "$pristine.partial" "$pristine"
  say "mimalloc source: $2"
}

from_tarball() {  # file, what
  local file=$1 what=$2 out="$work/unpacked"
  rm -rf "$out"; mkdir -p "$out"
  if [ "$(basename "$file")" = "$debian_tarball" ] &&
     [ "$(sha256sum "$file" | cut -d' ' -f1)" != "$debian_sha256" ]; then
    reasons+=("$what: SHA-256 is not Debian's ($debian_sha256)"); return 1
  fi
  if ! tar -xf "$file" -C "$out" 2>"$work/tar.err"; then
    reasons+=("$what: tar could not unpack it ($(tail -1 "$work/tar.err"))"); return 1
  fi
  local top=("$out"/*)
  if [ ${#top[@]} -ne 1 ] || [ ! -d "${top[0]}" ]; then
    reasons+=("$what: not a source tarball (one top folder expected)"); return 1
  fi
  if [ $have_git -eq 0 ] && [ "$(basename "$file")" = "$debian_tarball" ]; then
    # Checked by its hash above: Debian's layout already.
    keep_pristine "${top[0]}" "$what"; return 0
  fi
  accept_tree "${top[0]}" "$what"
}

from_git() {  # repository (path, bundle or URL), what
  local repo=$1 what=$2 g="$work/git" out="$work/checkout"
  if [ $have_git -eq 0 ]; then reasons+=("$what: git is not installed"); return 1; fi
  rm -rf "$g" "$out"; git init -q --bare "$g"
  # An unreachable host fails in seconds rather than waiting on a stalled
  # connection: no prompt, and a transfer slower than 1 KB/s for 20 s stops.
  local fetch=(env GIT_TERMINAL_PROMPT=0 GIT_HTTP_LOW_SPEED_LIMIT=1000 GIT_HTTP_LOW_SPEED_TIME=20
               git -C "$g" fetch -q)
  if ! "${fetch[@]}" --depth 1 "$repo" "$commit" 2>/dev/null &&
     ! "${fetch[@]}" "$repo" '+refs/tags/*:refs/tags/*' '+refs/heads/*:refs/heads/*' 2>"$work/git.err"; then
    reasons+=("$what: git could not fetch it ($( (grep '^fatal:' "$work/git.err" || tail -1 "$work/git.err") | head -1))"); return 1
  fi
  if ! git -C "$g" cat-file -e "$commit^{commit}" 2>/dev/null; then
    reasons+=("$what: has no commit $commit"); return 1
  fi
  if [ "$(git -C "$g" rev-parse "$commit^{tree}")" != "$full_tree" ]; then
    reasons+=("$what: commit $commit has another tree"); return 1
  fi
  mkdir -p "$out"
  git -C "$g" archive "$commit" | tar -x -C "$out"
  accept_tree "$out" "$what"
}

from_url() {  # url, what
  local url=$1 what=$2
  case "$url" in
    *.tar.gz|*.tgz|*.tar.xz|*.tar.bz2|*.tar)
      local file="$work/$(basename "$url")"
      if command -v curl >/dev/null; then
        curl -fsSL --connect-timeout 20 -o "$file" "$url" 2>"$work/dl.err" ||
          { reasons+=("$what: curl could not fetch it ($(tail -1 "$work/dl.err"))"); return 1; }
      elif command -v wget >/dev/null; then
        wget -q -T 20 -O "$file" "$url" 2>"$work/dl.err" ||
          { reasons+=("$what: wget could not fetch it"); return 1; }
      else
        reasons+=("$what: neither curl nor wget is installed"); return 1
      fi
      from_tarball "$file" "$what" ;;
    *) from_git "$url" "$what" ;;
  esac
}

try_present() {
  if [ -f "$pristine/$stamp_name" ] && [ "$(cat "$pristine/$stamp_name")" = "$tree" ]; then
    return 0
  fi
  local f
  for f in "$pkgfiles/$debian_tarball" "$pkgcache/$debian_tarball" \
           "$pkgfiles/mimalloc-2.0.9.tar.gz" "$pkgcache/mimalloc-2.0.9.tar.gz" \
           "$pkgfiles/v2.0.9.tar.gz" "$pkgcache/v2.0.9.tar.gz"; do
    if [ -f "$f" ] && from_tarball "$f" "${f#"$root"/}"; then return 0; fi
  done
  return 1
}

try_given() {
  local src=$given
  [ -n "$src" ] || return 1
  local what="--source $src"
  if [ -d "$src/.git" ] || [ -f "$src/HEAD" ]; then from_git "$src" "$what"
  elif [ -d "$src" ]; then
    rm -rf "$work/copy"; cp -a "$src" "$work/copy"; rm -rf "$work/copy/.git"
    accept_tree "$work/copy" "$what"
  elif [ -f "$src" ]; then
    if git bundle list-heads "$src" >/dev/null 2>&1; then from_git "$src" "$what"
    else from_tarball "$src" "$what"; fi
  elif [[ "$src" == *://* || "$src" == *@*:* ]]; then from_url "$src" "$what"
  else reasons+=("$what: no such file or folder"); return 1
  fi
}

try_debian() {
  if ! command -v apt-get >/dev/null; then reasons+=("Debian's source package: no apt-get here"); return 1; fi
  local apt="$work/apt"
  mkdir -p "$apt/parts" "$apt/lists/partial" "$apt/dl"; chmod 755 "$work" "$apt" "$apt/dl"
  # A deb-src list derived from this machine's own apt sources, in a private
  # directory, so the system's apt configuration and state stay untouched.
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    sed -n 's/^[[:space:]]*deb[[:space:]]/deb-src /p' "$f" >>"$apt/parts/derived.list"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    sed 's/^Types:[[:space:]]*deb[[:space:]]*$/Types: deb-src/' "$f" >"$apt/parts/$(basename "$f")"
  done
  local opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$apt/parts"
              -o "Dir::State::Lists=$apt/lists" -o Debug::NoLocking=1)
  say "fetching Debian's mimalloc source package (apt-get source)"
  if ! apt-get "${opts[@]}" update -qq >"$apt/log" 2>&1; then
    reasons+=("Debian's source package: apt-get update failed ($(tail -1 "$apt/log"))"); return 1
  fi
  (cd "$apt/dl" && apt-get "${opts[@]}" source --download-only -qq mimalloc=2.0.9+ds-2 >>"$apt/log" 2>&1) || true
  if [ ! -f "$apt/dl/$debian_tarball" ]; then
    reasons+=("Debian's source package: apt has no mimalloc 2.0.9+ds-2 here"); return 1
  fi
  from_tarball "$apt/dl/$debian_tarball" "Debian's source package" || return 1
  mkdir -p "$pkgcache"; cp "$apt/dl/$debian_tarball" "$pkgcache/$debian_tarball"
}

try_upstream() {
  local repo=$upstream
  say "fetching mimalloc $commit from $repo (git)"
  from_git "$repo" "upstream ($repo)"
}

got=0
IFS=, read -r -a order <<<"$order_list"
for source in "${order[@]}"; do
  case "$source" in
    present|given|debian|upstream) if "try_$source"; then got=1; break; fi ;;
    *) say "--sources: unknown source '$source' (present, given, debian, upstream)"
       exit 2 ;;
  esac
done
if [ $got -eq 0 ]; then
  {
    echo "setup: mimalloc 2.0.9's source could not be had (tried: ${order[*]})."
    for r in "${reasons[@]}"; do echo "setup:   $r"; done
    echo "setup: fetch one of these and put it in $pkgcache/ (or run scripts/fetch-mimalloc.sh --source PATH-or-URL):"
    echo "setup:   upstream's $upstream_tarball (saved as v2.0.9.tar.gz)"
    echo "setup:   Debian's $debian_tarball (sha256 $debian_sha256)"
    echo "setup:   or a clone of $upstream_repo with commit $commit"
  } >&2
  exit 1
fi

# The patched tree: made beside the destination, moved into place whole.
tool=()
if [ $have_git -eq 1 ]; then tool=(git apply); elif command -v patch >/dev/null; then
  tool=(patch -p1 --batch --quiet); else
  say "neither git nor patch is installed: one is needed to apply mnemosyne's changes to mimalloc"
  exit 1
fi
tmp="$dest.partial"
rm -rf "$tmp"
cp -a "$pristine" "$tmp"
rm -f "$tmp/$stamp_name"
for p in "${patches[@]}"; do
  # As outside any repository (git apply run inside one would ignore paths
  # outside the current folder): the search for one stops below the clone.
  if ! (cd "$tmp" && GIT_CEILING_DIRECTORIES="$root" \
          "${tool[@]}" <"$patchdir/mimalloc-$p.patch") 2>"$work/patch.err"; then
    say "mimalloc-$p.patch does not apply: $(tail -1 "$work/patch.err")"; rm -rf "$tmp"; exit 1
  fi
done
echo "$want" >"$tmp/$stamp_name"
rm -rf "$dest"
mv "$tmp" "$dest"
say "mimalloc source: $dest (patched)"
