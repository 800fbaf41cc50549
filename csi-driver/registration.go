package csidriver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Registrar serves the kubelet's plugin registration API (pluginregistration/v1) for the
// driver: what node-driver-registrar does, for clusters that do not run it. The kubelet
// watches its plugins_registry directory, finds the socket, asks GetInfo and connects to
// the CSI endpoint it names.
type Registrar struct {
	registerapi.UnimplementedRegistrationServer

	// Name is the CSI driver name.
	Name string
	// Endpoint is the CSI socket's path as the kubelet sees it (on the host).
	Endpoint string
	// Socket is where to serve the registration API, normally
	// <kubelet root>/plugins_registry/<name>-reg.sock.
	Socket string
	// Registered is called with the kubelet's verdict.
	Registered func(ok bool, reason string)
}

// Serve serves the registration API until ctx is done.
func (r *Registrar) Serve(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Dir(r.Socket), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(r.Socket), err)
	}
	if err := os.Remove(r.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing the old registration socket: %w", err)
	}
	lis, err := net.Listen("unix", r.Socket)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", r.Socket, err)
	}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, r)
	stop := context.AfterFunc(ctx, func() { srv.Stop(); _ = os.Remove(r.Socket) })
	defer stop()
	if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serving plugin registration: %w", err)
	}
	return nil
}

// GetInfo tells the kubelet the plugin's type, name and CSI endpoint.
func (r *Registrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              r.Name,
		Endpoint:          r.Endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

// NotifyRegistrationStatus receives the kubelet's verdict.
func (r *Registrar) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if r.Registered != nil {
		r.Registered(s.PluginRegistered, s.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}
