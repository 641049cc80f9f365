package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/tensorwire/tensorwire/internal/nodeproc"
)

var nodeCmd = command{
	name:  "node",
	usage: "tensorwire node --listen ADDR --root DIR [--token-file F] [--tls-cert F --tls-key F]",
	help: "serve other nodes' fill, read and describe calls on the TensorDicts under DIR, the shared root; " +
		`prints "listening on HOST:PORT" once it listens (--listen 127.0.0.1:0 picks a free port) and stops ` +
		"cleanly on SIGINT or SIGTERM; --token-file holds the shared secret clients must know (no access for " +
		"other users); --tls-cert and --tls-key (PEM) add TLS",
	run: runNode,
}

func runNode(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	var cfg nodeproc.Config
	fs.StringVar(&cfg.Listen, "listen", "", "TCP address to listen on, HOST:PORT")
	fs.StringVar(&cfg.Root, "root", "", "the shared root: references are resolved under it")
	fs.StringVar(&cfg.TokenFile, "token-file", "", "file holding the shared secret")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "PEM certificate file")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "PEM private key file")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, pos)
	case cfg.Listen == "":
		return fmt.Errorf("%w: missing --listen", errUsage)
	case cfg.Root == "":
		return fmt.Errorf("%w: missing --root", errUsage)
	case (cfg.TLSCert == "") != (cfg.TLSKey == ""):
		return fmt.Errorf("%w: give --tls-cert and --tls-key together", errUsage)
	}
	cfg.Log = slog.New(slog.NewTextHandler(stderr, nil))
	return nodeproc.Run(ctx, cfg, func(addr string) {
		fmt.Fprintln(stdout, nodeproc.ListeningPrefix+addr)
	})
}
