#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this machine, for Sluice's e2e suite, without
# Docker or a container registry:
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy and a kubelet
#   running runc containers through containerd, CNI bridge networking, CoreDNS, and a
#   StorageClass sluice-local with one local PersistentVolume per node (storage_up);
#   binaries built from the Go module proxy by build.sh (cached in $SLUICE_CACHE);
#   images written as OCI archives from local files and imported with ctr (pods use
#   imagePullPolicy: Never): localhost/sluice:e2e, localhost/minio:e2e, localhost/busybox:e2e,
#   localhost/coredns:e2e and the sandbox image localhost/pause:e2e.
#
# Usage (as root):
#   hack/cluster/local.sh up [--nodes N]
#                                  build what is missing, start the cluster, wait for DNS;
#                                  N > 1 (or NODES=N) runs N worker nodes, each in its own
#                                  network, mount and UTS namespaces (see "Several nodes")
#   hack/cluster/local.sh images   rebuild the sluice image from this checkout and re-import it
#   hack/cluster/local.sh down     stop every process it started (by pid), unmount, clean up
#   hack/cluster/local.sh env      print `export KUBECONFIG=... PATH=...` for a shell
#   hack/cluster/local.sh node-stop K
#                                  lose node K (of --nodes N > 1) as a crash would: KILL its
#                                  kubelet, kube-proxy, containerd and its pods' processes
#   hack/cluster/local.sh node-start K
#                                  start node K's containerd, kubelet and kube-proxy again
# Runtime state lives in $SLUICE_CLUSTER_DIR (default /var/tmp/sluice-cluster); the kubelet
# root is /var/lib/kubelet and the CSI plugin's state /var/lib/sluice, as in deploy/base.
# With --nodes N > 1 the control plane stays on the host and the nodes sluice-node-1..N each
# run their own containerd, kubelet and kube-proxy; see the section "Several nodes" below.
# Recipe and pitfalls: ../shared/reference/local-cluster (containerd needs
# restrict_oom_score_adj, the kubelet root must be rshared, kubelet failCgroupV1: false).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
cache=${SLUICE_CACHE:-$HOME/.cache/sluice}
dir=${SLUICE_CLUSTER_DIR:-/var/tmp/sluice-cluster}
kubelet_dir=/var/lib/kubelet
state_dir=/var/lib/sluice
pki=$dir/pki logs=$dir/logs pids=$dir/pids var=$dir/var etc=$dir/etc images=$dir/images
# The cluster's own containerd (never a containerd the machine runs for itself).
ctrd_run=/run/sluice-containerd
ctr() { command ctr --address "$ctrd_run/containerd.sock" "$@"; }
export KUBECONFIG=$pki/admin.kubeconfig
export CGO_ENABLED=0

node=$(hostname)
node_ip=${NODE_IP:-$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')}
[ -n "$node_ip" ] || node_ip=$(hostname -I | awk '{print $1}')

# Several nodes (--nodes N, N > 1): a bridge on the host, the control plane's address on it,
# node k at 10.250.0.(10+k) with pod CIDR 10.244.k.0/24 (see "Several nodes" below).
nodes=${NODES:-1}
multi=""
br=sluice-br0 br_ip=10.250.0.1 br_net=10.250.0.0/24
nodes_dir=$dir/nodes
tag=sluice-local-cluster # the comment on every iptables rule of the host the script adds

t0=$(date +%s)
log() { echo "local-cluster [$(($(date +%s) - t0))s]: $*" >&2; }
die() {
  echo "local-cluster: $*" >&2
  local f
  for f in "$logs"/*.log; do
    [ -f "$f" ] || continue
    echo "----- last lines of $f -----" >&2
    tail -n 20 "$f" >&2
  done
  exit 1
}

# wait_for WHAT SECONDS CMD...: run CMD every half second until it succeeds.
wait_for() {
  local what=$1 n=$(($2 * 2)); shift 2
  for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
  die "timed out waiting for $what (logs: $logs)"
}

# detached CMD...: exec CMD without the file descriptors above 2 this script inherited
# (call it in a subshell): a lock its caller holds (`flock /tmp/sluice-cluster.lock make
# e2e-local`) must not stay held by the cluster's daemons once the caller has ended.
detached() {
  local fd
  for fd in /proc/self/fd/*; do
    fd=${fd##*/}
    [ "$fd" -le 2 ] || eval "exec $fd>&-"
  done
  exec "$@"
}

# start NAME CMD...: run CMD in the background, output in $logs/NAME.log, pid in $pids.
start() {
  local name=$1; shift
  if [ -f "$pids/$name.pid" ] && kill -0 "$(cat "$pids/$name.pid")" 2>/dev/null; then
    log "$name already running (pid $(cat "$pids/$name.pid"))"; return 0
  fi
  (detached nohup "$@") >"$logs/$name.log" 2>&1 &
  echo $! >"$pids/$name.pid"
  log "started $name (pid $!)"
}

packages() {
  local need=() p
  for p in containerd runc containernetworking-plugins iptables conntrack busybox-static openssl curl; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
  done
  [ ${#need[@]} -eq 0 ] && return 0
  log "installing ${need[*]}"
  # Debian starts services on install; this cluster starts containerd itself.
  local created=""
  [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; created=1; }
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  [ -z "$created" ] || rm -f /usr/sbin/policy-rc.d
}

# oci_image ROOTFS NAME OUT ENTRYPOINT_JSON: write ROOTFS as a one-layer OCI image archive
# named NAME, which `ctr images import` loads as that image.
oci_image() {
  local root=$1 name=$2 out=$3 entrypoint=$4 w
  w=$(mktemp -d)
  mkdir -p "$w/blobs/sha256"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$root" -cf "$w/layer.tar" .
  gzip -n -1 -c "$w/layer.tar" >"$w/layer.tgz"
  local diff_id layer layer_size config config_size manifest manifest_size
  diff_id=$(sha256sum "$w/layer.tar" | cut -d' ' -f1)
  layer=$(sha256sum "$w/layer.tgz" | cut -d' ' -f1); layer_size=$(stat -c %s "$w/layer.tgz")
  mv "$w/layer.tgz" "$w/blobs/sha256/$layer"
  printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/usr/local/bin:/usr/bin:/bin"],"Entrypoint":%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$entrypoint" "$diff_id" >"$w/config"
  config=$(sha256sum "$w/config" | cut -d' ' -f1); config_size=$(stat -c %s "$w/config")
  mv "$w/config" "$w/blobs/sha256/$config"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
    "$config" "$config_size" "$layer" "$layer_size" >"$w/manifest"
  manifest=$(sha256sum "$w/manifest" | cut -d' ' -f1); manifest_size=$(stat -c %s "$w/manifest")
  mv "$w/manifest" "$w/blobs/sha256/$manifest"
  printf '{"imageLayoutVersion":"1.0.0"}' >"$w/oci-layout"
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest" "$manifest_size" "$name" "${name##*:}" >"$w/index.json"
  rm "$w/layer.tar"
  tar --owner=0 --group=0 -C "$w" -cf "$out" oci-layout index.json blobs
  rm -rf "$w"
}

# base_rootfs DIR: /etc/passwd and /etc/group with root and nonroot (65532), a /tmp.
base_rootfs() {
  mkdir -p "$1/etc" "$1/tmp" "$1/usr/local/bin"
  chmod 1777 "$1/tmp"
  printf 'root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$1/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$1/etc/group"
}

# sluice_image: the one sluice binary of this checkout, as localhost/sluice:e2e.
sluice_image() {
  log "image localhost/sluice:e2e from this checkout"
  local r=$images/sluice
  rm -rf "$r"; base_rootfs "$r"
  (cd "$repo" && go build -trimpath -ldflags "-s -w -X main.version=e2e-$(git rev-parse --short HEAD 2>/dev/null || echo dev)" \
    -o "$r/usr/local/bin/sluice" ./cmd/sluice)
  oci_image "$r" localhost/sluice:e2e "$images/sluice.tar" '["/usr/local/bin/sluice"]'
}

other_images() {
  local bin=$1 r
  log "images pause, busybox, coredns, minio"
  r=$images/pause; rm -rf "$r"; mkdir -p "$r"
  (cd "$repo" && go build -trimpath -ldflags '-s -w' -o "$r/pause" ./hack/cluster/pause)
  oci_image "$r" localhost/pause:e2e "$images/pause.tar" '["/pause"]'

  r=$images/busybox; rm -rf "$r"; base_rootfs "$r"; mkdir -p "$r/bin"
  cp /bin/busybox "$r/bin/busybox"
  local a
  for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -sf busybox "$r/bin/$a"; done
  oci_image "$r" localhost/busybox:e2e "$images/busybox.tar" '["/bin/sh"]'

  r=$images/coredns; rm -rf "$r"; base_rootfs "$r"
  cp "$bin/coredns" "$r/usr/local/bin/coredns"
  oci_image "$r" localhost/coredns:e2e "$images/coredns.tar" '["/usr/local/bin/coredns"]'

  r=$images/minio; rm -rf "$r"; base_rootfs "$r"
  cp -L "$cache/bin/minio" "$r/usr/local/bin/minio"
  oci_image "$r" localhost/minio:e2e "$images/minio.tar" '["/usr/local/bin/minio"]'
}

import_images() {
  local t
  for t in "$@"; do ctr -n k8s.io images import "$images/$t.tar" >/dev/null; done
}

# pki: a CA, the API server's serving certificate, a client certificate per component and
# the service-account key pair, with openssl; kubeconfigs for each client.
make_pki() {
  mkdir -p "$pki"; cd "$pki"
  [ -f ca.crt ] || openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj /CN=sluice-local-ca 2>/dev/null
  [ -f sa.key ] || { openssl genrsa -out sa.key 2048 2>/dev/null; openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null; }
  cert() { # name CN O [SAN]
    local n=$1 cn=$2 o=$3 san=${4:-}
    [ -f "$n.crt" ] && return 0
    openssl req -newkey rsa:2048 -nodes -keyout "$n.key" -out "$n.csr" -subj "/CN=$cn${o:+/O=$o}" 2>/dev/null
    printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=%s\n%s\n' \
      "${san:+serverAuth,}clientAuth" "${san:+subjectAltName=$san}" >"$n.ext"
    openssl x509 -req -in "$n.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$n.crt" -days 3650 -extfile "$n.ext" 2>/dev/null
  }
  cert apiserver kube-apiserver "" "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,DNS:$node,IP:127.0.0.1,IP:10.96.0.1,IP:$node_ip${multi:+,IP:$br_ip}"
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
  cert admin kubernetes-admin system:masters
  cert controller-manager system:kube-controller-manager ""
  cert scheduler system:kube-scheduler ""
  cert kube-proxy system:kube-proxy ""
  cert kubelet "system:node:$node" system:nodes
  local n
  for n in admin controller-manager scheduler kube-proxy kubelet; do
    cat >"$n.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "https://127.0.0.1:6443", certificate-authority: "$pki/ca.crt"}}]
users: [{name: $n, user: {client-certificate: "$pki/$n.crt", client-key: "$pki/$n.key"}}]
contexts: [{name: local, context: {cluster: local, user: $n}}]
current-context: local
EOF
  done
  cd - >/dev/null
}

containerd_up() {
  mkdir -p "$etc/cni" "$var/containerd"
  cat >"$etc/containerd.toml" <<EOF
version = 2
root = "$var/containerd"
state = "$ctrd_run"
[grpc]
  address = "$ctrd_run/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:e2e"
  # Without CAP_SYS_RESOURCE runc cannot lower a sandbox's oom_score_adj and every pod
  # fails with "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$etc/cni"
EOF
  cat >"$etc/cni/10-sluice.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "sluice-local", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$var/cni-ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}},
  {"type": "loopback"}]}
EOF
  sysctl -qw net.ipv4.ip_forward=1
  modprobe br_netfilter 2>/dev/null || true
  start containerd containerd --config "$etc/containerd.toml"
  wait_for containerd 20 ctr version
}

# shared_dir DIR: bind DIR onto itself and make it rshared, so that mounts made under it
# in a container with Bidirectional propagation reach the host (/ is private here).
shared_dir() {
  mkdir -p "$1"
  mountpoint -q "$1" || mount --bind "$1" "$1"
  mount --make-rshared "$1"
}

control_plane_up() {
  local bin=$1
  start etcd "$bin/etcd" --name local --data-dir "$var/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster local=http://127.0.0.1:2380
  wait_for etcd 30 curl -sf http://127.0.0.1:2379/health
  # Several nodes: the API server advertises the bridge address the nodes reach it at,
  # calls kubelets at their InternalIP (their hostnames resolve nowhere) and webhooks at
  # their endpoints' pod IPs (the host routes to every node's pod CIDR but runs no kube-proxy).
  local extra=() advertise=$node_ip
  [ -z "$multi" ] || { advertise=$br_ip; extra=(--kubelet-preferred-address-types=InternalIP --enable-aggregator-routing=true); }
  start kube-apiserver "$bin/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
    --secure-port=6443 --bind-address=0.0.0.0 --advertise-address="$advertise" "${extra[@]}" \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" --client-ca-file="$pki/ca.crt" \
    --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range=10.96.0.0/12 --authorization-mode=Node,RBAC --allow-privileged=true \
    --enable-admission-plugins=NodeRestriction \
    --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" --kubelet-client-key="$pki/apiserver-kubelet-client.key"
  wait_for kube-apiserver 60 curl -sf --cacert "$pki/ca.crt" https://127.0.0.1:6443/readyz
  start kube-controller-manager "$bin/kube-controller-manager" --kubeconfig="$pki/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$pki/controller-manager.kubeconfig" --authorization-kubeconfig="$pki/controller-manager.kubeconfig" \
    --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" --use-service-account-credentials=true \
    --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" --leader-elect=false
  start kube-scheduler "$bin/kube-scheduler" --kubeconfig="$pki/scheduler.kubeconfig" \
    --authentication-kubeconfig="$pki/scheduler.kubeconfig" --authorization-kubeconfig="$pki/scheduler.kubeconfig" \
    --leader-elect=false
}

node_up() {
  local bin=$1
  cat >"$etc/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://$ctrd_run/containerd.sock
authentication: {anonymous: {enabled: false}, webhook: {enabled: true}, x509: {clientCAFile: $pki/ca.crt}}
authorization: {mode: Webhook}
clusterDomain: cluster.local
clusterDNS: [10.96.0.10]
podLogsDir: $var/pod-logs
resolvConf: /etc/resolv.conf
# Images cannot be pulled again here: never garbage-collect them or evict for disk.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
EOF
  shared_dir "$kubelet_dir"
  shared_dir "$state_dir"
  start kubelet "$bin/kubelet" --config="$etc/kubelet.yaml" --kubeconfig="$pki/kubelet.kubeconfig" \
    --root-dir="$kubelet_dir" --node-ip="$node_ip" --hostname-override="$node"
  cat >"$etc/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $pki/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: 10.244.0.0/16
hostnameOverride: $node
nodePortAddresses: [primary]
EOF
  start kube-proxy "$bin/kube-proxy" --config="$etc/kube-proxy.yaml"
  wait_for "node $node registered" 60 "$bin/kubectl" get node "$node"
  "$bin/kubectl" wait --for=condition=Ready "node/$node" --timeout=120s >/dev/null
  wait_for "default service account" 60 "$bin/kubectl" get serviceaccount default
}

dns_up() {
  local bin=$1
  "$bin/kubectl" apply -f - >/dev/null <<'EOF'
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: system:coredns}
rules:
- {apiGroups: [""], resources: [endpoints, services, pods, namespaces], verbs: [list, watch]}
- {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: system:coredns}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:coredns}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
        }
        forward . /etc/resolv.conf
        cache 30
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      dnsPolicy: Default
      containers:
      - name: coredns
        image: localhost/coredns:e2e
        imagePullPolicy: Never
        args: [-conf, /etc/coredns/Corefile]
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        readinessProbe: {httpGet: {path: /ready, port: 8181}}
        securityContext:
          capabilities: {add: [NET_BIND_SERVICE], drop: [ALL]}
          readOnlyRootFilesystem: true
        volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
      volumes:
      - {name: config, configMap: {name: coredns}}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: 10.96.0.10
  selector: {k8s-app: kube-dns}
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
EOF
  "$bin/kubectl" -n kube-system rollout status deployment/coredns --timeout=120s >/dev/null
}

# storage_up: the StorageClass sluice-local (no provisioner, bound when a pod is
# scheduled) and one local PersistentVolume of it per node, a directory under
# $dir/volumes that `down` removes, so that a claim (NATS's, with the chart's
# nats.persistence) stays on its node across pod restarts, as on a real cluster.
storage_up() {
  local bin=$1 name k
  local names=("$node")
  if [ -n "$multi" ]; then
    names=()
    for k in $(seq 1 "$nodes"); do names+=("$(node_name "$k")"); done
  fi
  {
    cat <<'EOF'
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: sluice-local}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
EOF
    for name in "${names[@]}"; do
      mkdir -p "$dir/volumes/$name"
      cat <<EOF
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: sluice-local-$name}
spec:
  capacity: {storage: 8Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: sluice-local
  local: {path: $dir/volumes/$name}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$name]}]
EOF
    done
  } | "$bin/kubectl" apply -f - >/dev/null
}

# ---- Several nodes -----------------------------------------------------------------------
# Node k (1..N) is named sluice-node-k. It lives in
#   - the network namespace sluice-node-k (`ip netns`): eth0 = 10.250.0.(10+k)/24, the
#     peer of the veth sluice-vk on the host bridge sluice-br0 (10.250.0.1, where the API
#     server listens); its pods on its own cni0 bridge in 10.244.k.0/24, with a route to
#     every other node's pod CIDR through that node's address (and the host routes to each
#     pod CIDR too, so that the API server reaches webhooks at pod IPs);
#   - a mount and UTS namespace held by a `sleep` (pid in $pids/node-k-holder.pid): its
#     hostname is sluice-node-k, and $nodes_dir/k/{kubelet,sluice,cni,netns} are bind-mounted
#     over /var/lib/kubelet (rshared, for Bidirectional propagation), /var/lib/sluice,
#     /var/lib/cni and /run/netns, so what one node's kubelet, CSI plugin and CNI write is
#     its own, and no mount of a node is visible on the host;
#   - its own containerd (root, state and socket under $nodes_dir/k), kubelet (cgroup
#     root /sluice-node-k in every cgroup v1 hierarchy) and kube-proxy (iptables rules in
#     the node's network namespace), started with nsenter into those namespaces.
# The host keeps only the bridge, its routes, a MASQUERADE rule for the nodes' traffic out
# of the machine and two FORWARD rules for the bridge (all tagged "$tag"); `down` removes
# them, the namespaces, the cgroups and every process found in a node's cgroups.

node_name() { echo "sluice-node-$1"; }
node_addr() { echo "10.250.0.$((10 + $1))"; }
node_ctr() { local k=$1; shift; command ctr --address "$nodes_dir/$k/run/containerd.sock" "$@"; }
# holder K: the pid of the process holding node K's mount and UTS namespaces.
holder() { cat "$pids/node-$1-holder.pid"; }

# stop_pid NAME: stop the process of $pids/NAME.pid (TERM, then KILL after 30 s).
stop_pid() {
  local pid
  [ -f "$pids/$1.pid" ] || return 0
  pid=$(cat "$pids/$1.pid")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    log "stopped $1 ($pid)"
  fi
  rm -f "$pids/$1.pid"
}

# cgroup_roots: the mount points of the cgroup hierarchies (v1, and the v2 one beside them).
cgroup_roots() {
  awk '{for (i = 7; i <= NF; i++) if ($i == "-") { if ($(i+1) ~ /^cgroup2?$/ && $5 ~ /^\/sys\/fs\/cgroup\//) print $5; break }}' /proc/self/mountinfo | sort -u
}

network_up() {
  local k j a
  sysctl -qw net.ipv4.ip_forward=1
  modprobe br_netfilter 2>/dev/null || true
  ip link show "$br" >/dev/null 2>&1 || ip link add "$br" type bridge
  ip addr replace "$br_ip/24" dev "$br"
  ip link set "$br" up
  for k in $(seq "$nodes"); do
    a=$(node_addr "$k")
    ip netns add "$(node_name "$k")"
    ip link add "sluice-v$k" type veth peer name eth0 netns "$(node_name "$k")"
    ip link set "sluice-v$k" master "$br" up
    ip -n "$(node_name "$k")" link set lo up
    ip -n "$(node_name "$k")" addr add "$a/24" dev eth0
    ip -n "$(node_name "$k")" link set eth0 up
    ip -n "$(node_name "$k")" route add default via "$br_ip"
    for j in $(seq "$nodes"); do
      [ "$j" = "$k" ] || ip -n "$(node_name "$k")" route add "10.244.$j.0/24" via "$(node_addr "$j")"
    done
    ip route replace "10.244.$k.0/24" via "$a" dev "$br"
    ip netns exec "$(node_name "$k")" sh -c '
      sysctl -qw net.ipv4.ip_forward=1
      sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
      # Pods reach other nodes'"'"' pods with their own address; anything else leaves as the node.
      iptables -t nat -A POSTROUTING -s '"10.244.$k.0/24"' ! -d 10.244.0.0/16 -j MASQUERADE'
  done
  iptables -t nat -A POSTROUTING -s "$br_net" ! -o "$br" -m comment --comment "$tag" -j MASQUERADE
  iptables -I FORWARD -i "$br" -m comment --comment "$tag" -j ACCEPT
  iptables -I FORWARD -o "$br" -m comment --comment "$tag" -j ACCEPT
  log "network: bridge $br $br_ip, nodes $(node_addr 1)..$(node_addr "$nodes")"
}

# node_ns_up K: the mount and UTS namespaces of node K, held by a sleep.
node_ns_up() {
  local k=$1 d=$nodes_dir/$1 m
  mkdir -p "$d/kubelet" "$d/sluice" "$d/cni" "$d/netns" "$d/run" "$d/containerd" "$d/etc/cni" "$d/pod-logs"
  for m in "$kubelet_dir" "$state_dir" /var/lib/cni /run/netns; do mkdir -p "$m"; done
  (detached nohup nsenter --net="/run/netns/$(node_name "$k")" unshare --mount --uts --propagation private -- sh -c '
    set -e
    hostname "$1"
    mount --bind "$2/kubelet" "$3"; mount --make-rshared "$3"
    mount --bind "$2/sluice" "$4"; mount --make-rshared "$4"
    mount --bind "$2/cni" /var/lib/cni
    mount --bind "$2/netns" /run/netns
    echo $$ >"$5"
    exec sleep infinity' sh "$(node_name "$k")" "$d" "$kubelet_dir" "$state_dir" "$pids/node-$k-holder.pid") \
    >"$logs/node-$k-holder.log" 2>&1 &
  wait_for "node $k namespaces" 10 test -s "$pids/node-$k-holder.pid"
}

# node_cgroups_up K: the kubelet's cgroup root /sluice-node-K in every hierarchy.
node_cgroups_up() {
  local r c=/$(node_name "$1")
  for r in $(cgroup_roots); do
    mkdir -p "$r$c"
    if [ -f "$r/cpuset.cpus" ]; then
      cat "$r/cpuset.cpus" >"$r$c/cpuset.cpus"; cat "$r/cpuset.mems" >"$r$c/cpuset.mems"
    fi
  done
}

node_containerd_up() {
  local k=$1 d=$nodes_dir/$1
  cat >"$d/etc/containerd.toml" <<EOF
version = 2
root = "$d/containerd"
state = "$d/run"
[grpc]
  address = "$d/run/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:e2e"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$d/etc/cni"
EOF
  cat >"$d/etc/cni/10-sluice.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "sluice-local", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.$k.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$d/cni-ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}},
  {"type": "loopback"}]}
EOF
  start "node-$k-containerd" nsenter --target "$(holder "$k")" --mount --uts --net -- containerd --config "$d/etc/containerd.toml"
  wait_for "containerd of node $k" 20 node_ctr "$k" version
}

node_kube_up() {
  local k=$1 bin=$2 d=$nodes_dir/$1 name
  name=$(node_name "$k")
  cat >"$d/etc/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: /$name
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://$d/run/containerd.sock
authentication: {anonymous: {enabled: false}, webhook: {enabled: true}, x509: {clientCAFile: $pki/ca.crt}}
authorization: {mode: Webhook}
clusterDomain: cluster.local
clusterDNS: [10.96.0.10]
podLogsDir: $d/pod-logs
resolvConf: /etc/resolv.conf
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
EOF
  start "node-$k-kubelet" nsenter --target "$(holder "$k")" --mount --uts --net -- "$bin/kubelet" --config="$d/etc/kubelet.yaml" \
    --kubeconfig="$pki/node-$k.kubeconfig" --root-dir="$kubelet_dir" --node-ip="$(node_addr "$k")" --hostname-override="$name"
  cat >"$d/etc/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $pki/node-kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: 10.244.0.0/16
hostnameOverride: $name
nodePortAddresses: [primary]
# The conntrack table size is the machine's, not a node's: leave it alone.
conntrack: {maxPerCore: 0}
EOF
  start "node-$k-kube-proxy" nsenter --target "$(holder "$k")" --mount --uts --net -- "$bin/kube-proxy" --config="$d/etc/kube-proxy.yaml"
}

# node_pki: a kubelet certificate per node and kubeconfigs that reach the API server at
# the bridge address.
node_pki() {
  local k n
  cd "$pki"
  for k in $(seq "$nodes"); do
    n=$(node_name "$k")
    if [ ! -f "node-$k.crt" ]; then
      openssl req -newkey rsa:2048 -nodes -keyout "node-$k.key" -out "node-$k.csr" -subj "/CN=system:node:$n/O=system:nodes" 2>/dev/null
      printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' >"node-$k.ext"
      openssl x509 -req -in "node-$k.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "node-$k.crt" -days 3650 -extfile "node-$k.ext" 2>/dev/null
    fi
  done
  for n in $(seq "$nodes") kube-proxy; do
    local crt=node-$n
    [ "$n" = kube-proxy ] && crt=kube-proxy
    cat >"node-$n.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "https://$br_ip:6443", certificate-authority: "$pki/ca.crt"}}]
users: [{name: $crt, user: {client-certificate: "$pki/$crt.crt", client-key: "$pki/$crt.key"}}]
contexts: [{name: local, context: {cluster: local, user: $crt}}]
current-context: local
EOF
  done
  cd - >/dev/null
}

nodes_up() {
  local bin=$1 k t
  node_pki
  for k in $(seq "$nodes"); do
    node_ns_up "$k"
    node_cgroups_up "$k"
    node_containerd_up "$k"
    for t in pause busybox coredns minio sluice; do node_ctr "$k" -n k8s.io images import "$images/$t.tar" >/dev/null; done
  done
  for k in $(seq "$nodes"); do node_kube_up "$k" "$bin"; done
  for k in $(seq "$nodes"); do
    wait_for "node $(node_name "$k") registered" 60 "$bin/kubectl" get node "$(node_name "$k")"
  done
  "$bin/kubectl" wait --for=condition=Ready node --all --timeout=180s >/dev/null
  wait_for "default service account" 60 "$bin/kubectl" get serviceaccount default
  log "nodes ready: $("$bin/kubectl" get nodes -o jsonpath='{range .items[*]}{.metadata.name} {end}')"
}

# pids_in_cgroup C: the processes in cgroup C (any hierarchy) and below it.
pids_in_cgroup() {
  local r
  for r in $(cgroup_roots); do
    [ -d "$r$1" ] && find "$r$1" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -un
}

# node_kill_pods K: kill (KILL) node K's containerd shims (re-parented to init) and every
# process in its cgroups: its pods' processes.
node_kill_pods() {
  local k=$1 pid
  for pid in $(ps -eo pid=,args= | awk -v a="$nodes_dir/$k/run/containerd.sock" '$2 ~ /containerd-shim/ && index($0, a) {print $1}'); do
    kill -9 "$pid" 2>/dev/null || true
  done
  for pid in $(pids_in_cgroup "/$(node_name "$k")"); do kill -9 "$pid" 2>/dev/null || true; done
}

# node_stop K: lose node K as a crash would: KILL its kubelet, kube-proxy and containerd
# and every process of its pods, with no goodbye to the API server (its pods stay Running
# there until the node lifecycle controller or Sluice's controller acts). Its namespaces,
# network, cgroups and containerd root stay, for node_start.
node_stop() {
  local k=$1 n
  [ -f "$pids/node-$k-holder.pid" ] && kill -0 "$(holder "$k")" 2>/dev/null || die "node $k is not up (local.sh up --nodes N first)"
  for n in kubelet kube-proxy containerd; do
    [ -f "$pids/node-$k-$n.pid" ] && { kill -9 "$(cat "$pids/node-$k-$n.pid")" 2>/dev/null || true; }
    rm -f "$pids/node-$k-$n.pid"
  done
  node_kill_pods "$k"
  log "stopped node $(node_name "$k"): kubelet, kube-proxy, containerd and its pods' processes killed"
}

# node_start K: start node K's containerd, kubelet and kube-proxy again after node_stop,
# and wait for the node to be Ready.
node_start() {
  local k=$1 bin
  [ -f "$pids/node-$k-holder.pid" ] && kill -0 "$(holder "$k")" 2>/dev/null || die "node $k is not up (local.sh up --nodes N first)"
  bin=$("$repo/hack/cluster/build.sh" all)
  node_containerd_up "$k"
  node_kube_up "$k" "$bin"
  "$bin/kubectl" wait --for=condition=Ready "node/$(node_name "$k")" --timeout=180s >/dev/null || die "node $(node_name "$k") not Ready"
  log "started node $(node_name "$k")"
}

# nodes_down: everything of the nodes (processes, cgroups, namespaces, network); the
# control plane's own processes are stopped by down before.
nodes_down() {
  local k pid n c r netns_ino mnt_ino p table found
  # The nodes up started: by their pid files, their network namespaces and their cgroups.
  found=$( { ls "$pids" 2>/dev/null | sed -n 's/^node-\([0-9]*\)-.*\.pid$/\1/p'
             ls /run/netns 2>/dev/null | sed -n 's/^sluice-node-\([0-9]*\)$/\1/p'
             for r in $(cgroup_roots); do ls "$r" 2>/dev/null | sed -n 's/^sluice-node-\([0-9]*\)$/\1/p'; done; } | sort -un)
  for k in $found; do
    for n in kube-proxy kubelet; do stop_pid "node-$k-$n"; done
    if [ -f "$pids/node-$k-containerd.pid" ] && kill -0 "$(cat "$pids/node-$k-containerd.pid")" 2>/dev/null; then
      local t
      for t in $(node_ctr "$k" -n k8s.io tasks ls -q 2>/dev/null); do node_ctr "$k" -n k8s.io tasks kill -s KILL "$t" >/dev/null 2>&1; done
      sleep 1
      for t in $(node_ctr "$k" -n k8s.io tasks ls -q 2>/dev/null); do node_ctr "$k" -n k8s.io tasks rm -f "$t" >/dev/null 2>&1; done
    fi
    stop_pid "node-$k-containerd"
    # Shims and pods, then whatever is left in its network namespace or its mount namespace
    # (the holder last).
    node_kill_pods "$k"
    c=/$(node_name "$k")
    netns_ino=$(stat -L -c %i "/run/netns/$(node_name "$k")" 2>/dev/null || true)
    mnt_ino=""
    [ -f "$pids/node-$k-holder.pid" ] && mnt_ino=$(stat -L -c %i "/proc/$(cat "$pids/node-$k-holder.pid")/ns/mnt" 2>/dev/null || true)
    for p in /proc/[0-9]*; do
      [ "${p#/proc/}" = "$$" ] && continue
      if { [ -n "$netns_ino" ] && [ "$(stat -L -c %i "$p/ns/net" 2>/dev/null)" = "$netns_ino" ]; } ||
         { [ -n "$mnt_ino" ] && [ "$(stat -L -c %i "$p/ns/mnt" 2>/dev/null)" = "$mnt_ino" ]; }; then
        kill -9 "${p#/proc/}" 2>/dev/null
      fi
    done
    rm -f "$pids/node-$k-holder.pid"
    sleep 0.5
    # cgroups: deepest first, once their processes are gone.
    for r in $(cgroup_roots); do
      [ -d "$r$c" ] || continue
      for _ in 1 2 3 4 5 6 7 8 9 10; do
        find "$r$c" -depth -type d -exec rmdir {} + 2>/dev/null
        [ -d "$r$c" ] || break
        sleep 0.5
      done
      [ -d "$r$c" ] && log "cgroup $r$c is still there"
    done
    ip netns del "$(node_name "$k")" 2>/dev/null
    ip link del "sluice-v$k" 2>/dev/null
    log "removed node $(node_name "$k")"
  done
  ip link del "$br" 2>/dev/null
  local rule
  for table in filter nat; do
    iptables -t "$table" -S 2>/dev/null | grep -e "--comment $tag" | sed 's/^-A/-D/' |
      while read -r rule; do eval "iptables -t $table $rule"; done
  done
}

up() {
  [ "$(id -u)" -eq 0 ] || die "run as root (containerd, kubelet and mounts need it)"
  mkdir -p "$logs" "$pids" "$var" "$etc" "$images"
  packages
  log "building cluster binaries (cached; the first build takes about 15 minutes)"
  local bin
  bin=$("$repo/hack/cluster/build.sh" all)
  "$repo/hack/servers.sh" build
  other_images "$bin"
  sluice_image
  make_pki
  if [ -n "$multi" ] && [ -f "$pids/node-1-holder.pid" ] && kill -0 "$(holder 1)" 2>/dev/null; then
    log "the nodes are already up (local.sh down first to change them)"
    control_plane_up "$bin"
  elif [ -n "$multi" ]; then
    network_up
    control_plane_up "$bin"
    nodes_up "$bin"
  else
    containerd_up
    import_images pause busybox coredns minio sluice
    control_plane_up "$bin"
    node_up "$bin"
  fi
  dns_up "$bin"
  storage_up "$bin"
  ln -sf "$bin/kubectl" "$dir/kubectl"
  log "cluster ready: export KUBECONFIG=$KUBECONFIG PATH=$bin:\$PATH"
}

# down: stop what up started, newest first, by the pids it recorded; then remove the
# mounts, network devices and iptables chains the kubelet, CNI and kube-proxy left.
down() {
  set +e
  local bin="$cache/cluster/kube-${KUBE_VERSION:-v1.35.4}/bin" n pid
  if [ -f "$pids/kube-apiserver.pid" ] && kill -0 "$(cat "$pids/kube-apiserver.pid")" 2>/dev/null; then
    "$bin/kubectl" delete namespace -l sluice.io/e2e --wait=false >/dev/null 2>&1
    "$bin/kubectl" delete pods --all -A --grace-period=1 --timeout=60s >/dev/null 2>&1
  fi
  for n in kube-proxy kubelet kube-scheduler kube-controller-manager kube-apiserver etcd; do
    [ -f "$pids/$n.pid" ] || continue
    pid=$(cat "$pids/$n.pid")
    if kill "$pid" 2>/dev/null; then
      for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
      log "stopped $n ($pid)"
    fi
    rm -f "$pids/$n.pid"
  done
  nodes_down
  if [ -f "$pids/containerd.pid" ] && kill -0 "$(cat "$pids/containerd.pid")" 2>/dev/null; then
    local t shims
    for t in $(ctr -n k8s.io tasks ls -q 2>/dev/null); do ctr -n k8s.io tasks kill -s KILL "$t" >/dev/null 2>&1; done
    sleep 1
    for t in $(ctr -n k8s.io tasks ls -q 2>/dev/null); do ctr -n k8s.io tasks rm -f "$t" >/dev/null 2>&1; done
    # The shims were re-parented to init: find them before containerd goes.
    shims=$(ps -eo pid=,args= | awk '$2 ~ /containerd-shim-runc-v2/ && /containerd.sock/ {print $1}')
    kill "$(cat "$pids/containerd.pid")"; log "stopped containerd"
    for pid in $shims; do kill "$pid" 2>/dev/null; done
  fi
  rm -f "$pids/containerd.pid"
  [ -x "$bin/kube-proxy" ] && "$bin/kube-proxy" --cleanup >/dev/null 2>&1
  ip link del cni0 2>/dev/null
  local ipt table rule chain
  for ipt in iptables ip6tables; do
    for table in filter nat mangle; do
      "$ipt" -t "$table" -S 2>/dev/null | grep -E '^-A [A-Z]+ .*-j KUBE-' | grep -vE '^-A KUBE-' | sed 's/^-A/-D/' |
        while read -r rule; do eval "$ipt -t $table $rule"; done
      for chain in $("$ipt" -t "$table" -S 2>/dev/null | awk '/^-N KUBE-/{print $2}'); do "$ipt" -t "$table" -F "$chain"; done
      for chain in $("$ipt" -t "$table" -S 2>/dev/null | awk '/^-N KUBE-/{print $2}'); do "$ipt" -t "$table" -X "$chain"; done
    done
  done
  # What the CNI bridge plugin leaves on the host for a sandbox torn down without CNI DEL
  # (its masquerade chains, named by the network "sluice-local").
  for table in nat filter; do
    iptables -t "$table" -S 2>/dev/null | grep -E '^-A [A-Z]+ .*name: \\"sluice-local\\".* -j CNI-' | sed 's/^-A/-D/' |
      while read -r rule; do eval "iptables -t $table $rule"; done
    for chain in $(iptables -t "$table" -S 2>/dev/null | awk '/^-N CNI-/{print $2}'); do
      iptables -t "$table" -S "$chain" | grep -q 'name: \\"sluice-local\\"' || continue
      iptables -t "$table" -F "$chain"; iptables -t "$table" -X "$chain"
    done
  done
  # Deepest first: pod volumes (FUSE, tmpfs, binds), the store, then the shared roots.
  awk '{print $5}' /proc/self/mountinfo | grep -E "^($kubelet_dir|$state_dir|$dir|$ctrd_run|/run/netns)(/|$)" | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null; done
  # Pod network namespaces whose mount is gone (containerd's, named cni-*).
  for m in /run/netns/cni-*; do
    [ -e "$m" ] && ! mountpoint -q "$m" && rm -f "$m"
  done
  # Everything but the logs (a failed run is read from them).
  rm -rf "$var" "$pki" "$pids" "$etc" "$images" "$dir/kubectl" "$dir/volumes" "$kubelet_dir" "$state_dir" "$ctrd_run" "$nodes_dir"
  set -e
}

cmd=${1:-}
[ $# -eq 0 ] || shift
node_arg=""
case "$cmd" in node-stop|node-start) node_arg=${1:-}; [ $# -eq 0 ] || shift ;; esac
case "$node_arg" in *[!0-9]*) echo "local-cluster: $cmd needs a node number, not '$node_arg'" >&2; exit 2 ;; esac
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes=${2:?--nodes needs a number}; shift 2 ;;
    --nodes=*) nodes=${1#--nodes=}; shift ;;
    *) echo "local-cluster: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$nodes" in ''|*[!0-9]*|0) echo "local-cluster: --nodes must be a positive number, not '$nodes'" >&2; exit 2 ;; esac
[ "$nodes" -eq 1 ] || multi=1

case "$cmd" in
  up) up ;;
  down) down ;;
  node-stop) node_stop "${node_arg:?node-stop needs a node number}" ;;
  node-start) node_start "${node_arg:?node-start needs a node number}" ;;
  images)
    mkdir -p "$images"; sluice_image
    if ls "$pids"/node-*-containerd.pid >/dev/null 2>&1; then
      for f in "$pids"/node-*-containerd.pid; do
        k=${f##*/node-}; k=${k%%-*}
        node_ctr "$k" -n k8s.io images import "$images/sluice.tar" >/dev/null
      done
    else
      import_images sluice
    fi
    KUBECONFIG=$KUBECONFIG "$dir/kubectl" -n sluice-system rollout restart deployment/sluice-controller daemonset/sluice-csi statefulset/sluice-nats >/dev/null 2>&1 || true
    ;;
  env) echo "export KUBECONFIG=$KUBECONFIG PATH=$cache/cluster/kube-${KUBE_VERSION:-v1.35.4}/bin:\$PATH" ;;
  *) echo "usage: $0 up [--nodes N]|down|images|env|node-stop K|node-start K" >&2; exit 2 ;;
esac
