#!/usr/bin/env bash
# Spark needs Java 17 or newer: use the one on PATH, or install Debian's OpenJDK 17.
set -euo pipefail

java_major() {
    java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}

if command -v java >/dev/null 2>&1 && [ "$(java_major)" -ge 17 ] 2>/dev/null; then
    exit 0
fi
echo "Java 17+ not found (Spark needs it); installing openjdk-17-jre-headless" >&2
if ! "$(dirname "$0")/ensure-apt.sh" openjdk-17-jre-headless; then
    echo "error: could not install Java 17. Install a JDK or JRE 17+ and put java on PATH." >&2
    exit 1
fi
