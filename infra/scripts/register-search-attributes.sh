#!/bin/sh
# Register gpuflow's search attributes (GpuflowStatus, GpuflowFleet, GpuflowGpu, GpuflowPriority,
# GpuflowQueue) on a Temporal cluster with the `temporal` CLI. Safe to run again: an attribute
# that already exists with the same type counts as registered.
#
#   GPUFLOW_TEMPORAL_ADDRESS=temporal.internal:7233 GPUFLOW_TEMPORAL_NAMESPACE=gpuflow \
#       infra/scripts/register-search-attributes.sh [--create-namespace]
#
# Environment (the same names gpuflow reads):
#   GPUFLOW_TEMPORAL_ADDRESS    host:port of the frontend (default 127.0.0.1:7233)
#   GPUFLOW_TEMPORAL_NAMESPACE  namespace (default "default")
#   GPUFLOW_NAMESPACE_RETENTION retention of closed jobs when --create-namespace creates it (7d)
#   GPUFLOW_WAIT_S              how long to wait for the server and namespace (default 120)
#   TEMPORAL_CLI                the CLI binary (default: temporal on PATH)
# TLS or an API key: the CLI's own TEMPORAL_TLS_* and TEMPORAL_API_KEY variables apply.
#
# POSIX sh on purpose: it also runs inside the temporalio/admin-tools image (infra/compose).
set -eu

usage() {
    echo "usage: $0 [--create-namespace]"
    echo "  --create-namespace  create the namespace first when it does not exist"
}

create_namespace=false
for arg in "$@"; do
    case $arg in
        --create-namespace) create_namespace=true ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done

address=${GPUFLOW_TEMPORAL_ADDRESS:-127.0.0.1:7233}
namespace=${GPUFLOW_TEMPORAL_NAMESPACE:-default}
retention=${GPUFLOW_NAMESPACE_RETENTION:-7d}
wait_s=${GPUFLOW_WAIT_S:-120}
cli=${TEMPORAL_CLI:-temporal}

# Must match SEARCH_ATTRIBUTES in gpuflow/workflows/job.py.
attributes="GpuflowStatus=Keyword GpuflowFleet=Keyword GpuflowGpu=Keyword GpuflowPriority=Int GpuflowQueue=Keyword"

if ! command -v "$cli" >/dev/null 2>&1; then
    echo "error: the temporal CLI ($cli) is not on PATH; set TEMPORAL_CLI" >&2
    exit 1
fi

deadline=$(($(date +%s) + wait_s))
time_left() { [ "$(date +%s)" -lt "$deadline" ]; }

until "$cli" operator cluster health --address "$address" >/dev/null 2>&1; do
    if ! time_left; then
        echo "error: Temporal at $address is not healthy after ${wait_s}s" \
            "(check GPUFLOW_TEMPORAL_ADDRESS)" >&2
        exit 1
    fi
    sleep 2
done

if ! "$cli" operator namespace describe --address "$address" --namespace "$namespace" \
    >/dev/null 2>&1; then
    if [ "$create_namespace" != true ]; then
        echo "error: namespace $namespace does not exist on $address; create it" \
            "(temporal operator namespace create --namespace $namespace) or pass" \
            "--create-namespace" >&2
        exit 1
    fi
    "$cli" operator namespace create --address "$address" --namespace "$namespace" \
        --retention "$retention"
    echo "created namespace $namespace (retention $retention)"
fi

# A namespace just created takes a few seconds to reach every frontend, so failures other than
# "already exists" are retried until the deadline.
for pair in $attributes; do
    name=${pair%%=*}
    type=${pair#*=}
    while :; do
        if output=$("$cli" operator search-attribute create --address "$address" \
            --namespace "$namespace" --name "$name" --type "$type" 2>&1); then
            echo "registered $name ($type) on namespace $namespace"
            break
        fi
        case $output in
            *"different type"*)
                echo "error: $name exists on namespace $namespace with another type;" \
                    "gpuflow needs $type: $output" >&2
                exit 1
                ;;
            *"already exists"* | *"AlreadyExists"*)
                echo "$name ($type) already registered on namespace $namespace"
                break
                ;;
        esac
        if ! time_left; then
            echo "error: cannot register $name on namespace $namespace: $output" >&2
            exit 1
        fi
        sleep 2
    done
done
