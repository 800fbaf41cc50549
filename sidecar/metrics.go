package sidecar

import (
	"errors"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-io/sluice/internal/streamfs"
)

// Metric descriptions. Every series carries the pod's workflow, step, instance and node
// as constant labels.
var (
	descBytesWritten = prometheus.NewDesc("sluice_volume_written_bytes_total",
		"Bytes the pod's containers wrote to the streaming volume.", nil, nil)
	descBytesRead = prometheus.NewDesc("sluice_volume_read_bytes_total",
		"Bytes the pod's containers read from the streaming volume.", nil, nil)
	descPublished = prometheus.NewDesc("sluice_transport_published_bytes_total",
		"Data bytes this pod published to the workflow's stream (acknowledged).", nil, nil)
	descReceived = prometheus.NewDesc("sluice_transport_received_bytes_total",
		"Data bytes of other nodes this pod stored in the node store as its node's materialiser.", nil, nil)
	descRejected = prometheus.NewDesc("sluice_transport_rejected_messages_total",
		"Messages of other pods refused (invalid, or contradicting the rules).", nil, nil)
	descCommitted = prometheus.NewDesc("sluice_files_committed",
		"Files and directories committed, as this pod's engine sees the workflow.", nil, nil)
	descBlocked = prometheus.NewDesc("sluice_blocked_readers",
		"Requests of the pod's containers waiting on a commit or firing rule now.", nil, nil)
	descBlockedSeconds = prometheus.NewDesc("sluice_blocked_seconds_total",
		"Time requests of the pod's containers spent waiting on the rules, summed over finished waits.", nil, nil)
	descStoreUsed = prometheus.NewDesc("sluice_store_used_bytes",
		"Bytes this pod accounts in the node store (its writes and, as materialiser, other nodes' files).", nil, nil)
	descStoreLimit = prometheus.NewDesc("sluice_store_limit_bytes",
		"The workflow's volume size limit per node store (0: none).", nil, nil)
	descDiskUsed = prometheus.NewDesc("sluice_store_disk_used_bytes",
		"Bytes this pod accounts in the node store's disk tier (the files of spec.tiers.fs).", nil, nil)
	descDiskLimit = prometheus.NewDesc("sluice_store_disk_limit_bytes",
		"The workflow's disk tier size limit per node (spec.volume.disk.sizeLimit; 0: none).", nil, nil)
	descSpilledBytes = prometheus.NewDesc("sluice_store_spilled_bytes_total",
		"Bytes this pod's sidecar put in the disk tier because the memory tier was full: files moved there (committed, or being written and closed) and the bytes written to files moved or created there.", nil, nil)
	descReleasedFiles = prometheus.NewDesc("sluice_store_released_files_total",
		"Consumed files this pod's sidecar deleted from the node store once their consumers had exited.", nil, nil)
	descReleasedBytes = prometheus.NewDesc("sluice_store_released_bytes_total",
		"Bytes of the Consumed files this pod's sidecar deleted from the node store.", nil, nil)
	descOldestWait = prometheus.NewDesc("sluice_oldest_wait_seconds",
		"Age of the oldest request of the pod's containers waiting on the rules now (0: none waits).", nil, nil)
	descWaitDuration = prometheus.NewDesc("sluice_wait_duration_seconds",
		"How long requests of the pod's containers (open, read, readdir, stat) waited until the commit or firing rule let them through, or the wait failed.", nil, nil)
	descUploadsInProgress = prometheus.NewDesc("sluice_uploads_in_progress",
		"Uploads of permanent outputs to object storage running now.", nil, nil)
	descUploadedFiles = prometheus.NewDesc("sluice_uploaded_files_total",
		"Permanent outputs this pod stored in object storage.", nil, nil)
	descUploadedBytes = prometheus.NewDesc("sluice_uploaded_bytes_total",
		"Bytes of the permanent outputs this pod stored in object storage.", nil, nil)
	descUploadFailures = prometheus.NewDesc("sluice_upload_failures_total",
		"Uploads of permanent outputs that failed.", nil, nil)
	descPassthrough = prometheus.NewDesc("sluice_passthrough",
		"1 when the kernel reads committed files from the node store without the sidecar (FUSE passthrough), 0 when the sidecar serves every read.", nil, nil)
)

// collector reads the sidecar's live counters at each scrape.
type collector struct{ s *Sidecar }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBytesWritten, descBytesRead, descPublished, descReceived, descRejected,
		descCommitted, descBlocked, descBlockedSeconds, descStoreUsed, descStoreLimit, descDiskUsed, descDiskLimit, descSpilledBytes, descOldestWait, descWaitDuration,
		descUploadsInProgress, descUploadedFiles, descUploadedBytes, descUploadFailures, descPassthrough, descReleasedFiles, descReleasedBytes} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	if s.view != nil {
		st := s.view.Stats()
		ch <- prometheus.MustNewConstMetric(descBytesWritten, prometheus.CounterValue, float64(st.BytesWritten))
		ch <- prometheus.MustNewConstMetric(descBytesRead, prometheus.CounterValue, float64(st.BytesRead))
		ch <- prometheus.MustNewConstMetric(descBlocked, prometheus.GaugeValue, float64(st.Blocked))
		ch <- prometheus.MustNewConstMetric(descBlockedSeconds, prometheus.CounterValue, st.BlockedTotal.Seconds())
		oldest := 0.0
		if len(st.Waits) > 0 {
			oldest = time.Since(st.Waits[0].Since).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(descOldestWait, prometheus.GaugeValue, oldest)
		buckets := map[float64]uint64{}
		for i, b := range streamfs.WaitBuckets {
			if i < len(st.WaitDurations.Counts) {
				buckets[b] = st.WaitDurations.Counts[i]
			} else {
				buckets[b] = 0
			}
		}
		ch <- prometheus.MustNewConstHistogram(descWaitDuration, st.WaitDurations.Count, st.WaitDurations.Sum, buckets)
		passthrough := 0.0
		if s.view.Passthrough() {
			passthrough = 1
		}
		ch <- prometheus.MustNewConstMetric(descPassthrough, prometheus.GaugeValue, passthrough)
	}
	if s.node != nil && s.node.Copier != nil {
		us := s.node.Copier.Stats()
		ch <- prometheus.MustNewConstMetric(descUploadsInProgress, prometheus.GaugeValue, float64(us.InProgress))
		ch <- prometheus.MustNewConstMetric(descUploadedFiles, prometheus.CounterValue, float64(us.Stored))
		ch <- prometheus.MustNewConstMetric(descUploadedBytes, prometheus.CounterValue, float64(us.Bytes))
		ch <- prometheus.MustNewConstMetric(descUploadFailures, prometheus.CounterValue, float64(us.Failed))
	}
	if s.direct != nil {
		// Without FUSE the sidecar sees the app's bytes when it ingests them; reads and
		// waits happen in the app, out of its sight.
		ch <- prometheus.MustNewConstMetric(descBytesWritten, prometheus.CounterValue, float64(s.direct.Stats().BytesIngested))
	}
	if s.node != nil && s.node.Peer != nil {
		tc := s.node.Peer.Counters()
		ch <- prometheus.MustNewConstMetric(descPublished, prometheus.CounterValue, float64(tc.BytesPublished))
		ch <- prometheus.MustNewConstMetric(descReceived, prometheus.CounterValue, float64(tc.BytesReceived))
		ch <- prometheus.MustNewConstMetric(descRejected, prometheus.CounterValue, float64(tc.Rejected))
	}
	if s.node != nil {
		ch <- prometheus.MustNewConstMetric(descCommitted, prometheus.GaugeValue, float64(s.node.Engine.Counters()))
		ch <- prometheus.MustNewConstMetric(descStoreUsed, prometheus.GaugeValue, float64(s.node.Store.Used()))
		ch <- prometheus.MustNewConstMetric(descStoreLimit, prometheus.GaugeValue, float64(s.node.Store.Limit()))
		ch <- prometheus.MustNewConstMetric(descDiskUsed, prometheus.GaugeValue, float64(s.node.Store.DiskUsed()))
		ch <- prometheus.MustNewConstMetric(descDiskLimit, prometheus.GaugeValue, float64(s.node.Store.DiskLimit()))
		_, spilled := s.node.Store.Spilled()
		ch <- prometheus.MustNewConstMetric(descSpilledBytes, prometheus.CounterValue, float64(spilled))
		ch <- prometheus.MustNewConstMetric(descReleasedFiles, prometheus.CounterValue, float64(s.releasedFiles.Load()))
		ch <- prometheus.MustNewConstMetric(descReleasedBytes, prometheus.CounterValue, float64(s.releasedBytes.Load()))
	}
}

// Handler returns the sidecar's HTTP endpoints: /metrics (Prometheus), /readyz (200 once
// the volume is served) and /healthz.
func (s *Sidecar) Handler() http.Handler {
	reg := prometheus.NewRegistry()
	labels := prometheus.Labels{"workflow": s.vol.Workflow, "step": s.vol.Step, "instance": strconv.Itoa(s.vol.Instance), "node": s.vol.Node}
	prometheus.WrapRegistererWith(labels, reg).MustRegister(collector{s})
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.Ready() {
			http.Error(w, "not serving the volume", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	return mux
}

func (s *Sidecar) serveHTTP() {
	s.http = &http.Server{Addr: s.opts.MetricsAddr, Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	lis, err := net.Listen("tcp", s.opts.MetricsAddr)
	if err != nil {
		s.log.Error(err, "serving metrics", "addr", s.opts.MetricsAddr)
		return
	}
	go func() {
		if err := s.http.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error(err, "serving metrics")
		}
	}()
}
