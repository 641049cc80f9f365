package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/tensorwire/tensorwire/internal/metrics"
	"github.com/tensorwire/tensorwire/internal/nodeproc"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/store"
)

var nodeCmd = command{
	name:  "node",
	usage: "tensorwire node --listen ADDR --root DIR [--token-file F | --insecure] [--tls-cert F --tls-key F] [--coherent-storage] [--buffer NAME[,capacity=N][,sampler=S]...] [--store NAME[,max-value=SIZE]...] [--loader NAME,dataset=PREFIX,batch=N[,...]] [--serve NAME,params=P|store=S,param=N[,...]] [--metrics ADDR] [--parent PID]",
	help: "serve other nodes' fill, read and describe calls on the TensorDicts under DIR, the shared root; " +
		`prints "listening on HOST:PORT" once it listens (--listen 127.0.0.1:0 picks a free port) and stops ` +
		"cleanly on SIGINT or SIGTERM; --token-file holds the shared secret clients must know (no access for " +
		"other users; make one with: umask 077; head -c 32 /dev/urandom | base64 > token), and a node listening " +
		"on anything but loopback refuses to start without one unless --insecure is given; --tls-cert and --tls-key (PEM) add TLS; --coherent-storage lets a client on another machine or mount that opts in too " +
		"(rpc.WithCoherentStorage) count as sharing the node's page cache when its filesystem passes a probe at each " +
		"connection (a store through one side's mapping seen in the other's at once, both ways): for Lustre, which says " +
		"it keeps mappings coherent across clients; NFS, CephFS, GPFS and FUSE fail it; each --buffer serves the replay buffer at DIR/NAME " +
		"(replay.Dial), opened if it exists and created otherwise, with settings capacity=N, " +
		samplerHelp() + ", min-size=N, lease=D (how long a " +
		"writer's reservation lasts, default 30s); buffers are " +
		"checkpointed every --checkpoint-every and when the node stops (--checkpoint-every 0: only then); each --store serves the store of bins and " +
		"parameters at DIR/NAME (store.Dial), created if missing or empty, with settings max-value=SIZE, inline=SIZE, " +
		"sync=always|none, lease=D, get-timeout=D, history=N, trash-grace=D (how long a deleted value stays in trash/ for readers still mapping it, default 1m), repair=drop (drop what the log and the folder disagree on, which the node otherwise only reports) (docs/store.md); each --loader serves a producer of the " +
		"dataset at PREFIX (loader.Dial), its ring in DIR/NAME, with settings " + loaderHelp + "; each --serve serves as NAME the MLP whose PyTorch " +
		"state_dict is the TensorDict at DIR/P (params=P), or the parameter set N of the node's store S, following its " +
		"new versions (store=S,param=N) (serve.Dial), batching its clients' predictions, with settings replicas=N, " +
		"max-batch=N (default 16), max-delay=D (default 0: greedy), queue=N (rows waiting, default 4096), lease=D " +
		"(a client's registration, default 30s); with replicas=0 it runs no model itself, and replicas attach from " +
		"other processes (tensorwire.serve.Replica: a torch module in Python), the schemas given as input=F,output=F " +
		"(KEY:DTYPE:SHAPE joined by +, e.g. input=obs:float32:64,output=logits:float32:16), attach-wait=D (default " +
		"10s) bounding a request's wait for one and replica-timeout=D (default 30s) a batch's; --metrics ADDR serves Prometheus metrics at http://ADDR/metrics " +
		`and prints "metrics on URL" after the listening line (tensorwire stats ADDR prints them; docs/operations.md); ` +
		"--parent PID stops the node cleanly, as SIGTERM does, once process PID exits, however it exits",
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
	fs.BoolVar(&cfg.CoherentStorage, "coherent-storage", false, "let a client on another machine or mount that opts in too (rpc.WithCoherentStorage) count as sharing this node's page cache when its filesystem passes the coherence probe: for Lustre; NFS, CephFS, GPFS and FUSE fail it")
	var buffers bufferFlags
	fs.Var(&buffers, "buffer", "serve the replay buffer at ROOT/NAME: NAME[,capacity=N][,sampler=KIND][,PARAM=X...][,min-size=N][,lease=D][,samples-per-insert=X][,error-buffer=X][,max-times-sampled=N][,writer=round_robin|top_k][,key=K][,traj-key=K] (repeatable), with "+samplerHelp())
	var stores storeFlags
	fs.Var(&stores, "store", "serve the store at ROOT/NAME (store.Dial), created if missing or empty: NAME[,max-value=SIZE][,inline=SIZE][,sync=always|none][,lease=D][,get-timeout=D][,history=N][,trash-grace=D][,repair=drop] (repeatable)")
	var loaders loaderFlags
	fs.Var(&loaders, "loader", "serve a producer of batches of the dataset at PREFIX, its ring in ROOT/NAME: "+loaderHelp+" (repeatable)")
	var models serveFlags
	fs.Var(&models, "serve", "serve as NAME the MLP whose PyTorch state_dict is at ROOT/P (serve.Dial): "+serveUsage+" (repeatable)")
	every := fs.Duration("checkpoint-every", time.Minute, "how often the buffers are checkpointed (0: only when the node stops)")
	metricsAddr := fs.String("metrics", "", "serve Prometheus metrics at http://ADDR/metrics, HOST:PORT (no token: keep it on a network you trust); tensorwire stats ADDR prints them")
	parent := fs.Int("parent", 0, "stop cleanly, as on SIGTERM, once process PID exits, however it exits: for a node that must not outlive the program that started it (Python's tensorwire.Node passes its own pid)")
	insecure := fs.Bool("insecure", false, "serve without a token on a non-loopback address: anyone who reaches it reads and writes every file under the root")
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
	case *every < 0 || *every > 0 && *every < time.Second:
		// Under a second, checkpoints (each syncs the buffers' files) would
		// run back to back: the ticker drops the ticks a slow one misses.
		return fmt.Errorf("%w: --checkpoint-every %v: want 0 (only when the node stops) or 1s or more", errUsage, *every)
	}
	if err := loaders.checkNames(buffers, stores); err != nil {
		return err
	}
	cfg.Log = slog.New(slog.NewTextHandler(stderr, nil))
	if *parent != 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		pid := *parent
		if err := watchExit(ctx, pid, func() {
			cfg.Log.Info("node: stopping, its parent process exited (--parent)", "pid", pid)
			cancel()
		}); err != nil {
			return fmt.Errorf("%w: --parent %d: %v", errUsage, pid, err)
		}
	}
	// What the server checks when it starts (nodeproc.Run), checked before
	// any service makes its files under the root: a start that fails on
	// them leaves nothing there, and a --root that is not there is not made.
	if err := nodeproc.Check(cfg); err != nil {
		return err
	}
	open, err := reachableFromOthers(cfg.Listen)
	if err != nil {
		return fmt.Errorf("%w: --listen %s: %v", errUsage, cfg.Listen, err)
	}
	if cfg.TokenFile == "" {
		switch {
		case open && !*insecure:
			return fmt.Errorf("%w: --listen %s accepts connections from other machines, and without a token anyone "+
				"who reaches it can read and write every file under --root (TLS alone authenticates no client). "+
				"Make a token file and pass it, giving clients the same secret (rpc.WithToken):\n"+
				"    umask 077; head -c 32 /dev/urandom | base64 > token\n"+
				"    tensorwire node --token-file token --listen %s --root %s ...\n"+
				"or listen on loopback (127.0.0.1:PORT), or pass --insecure to serve without a token on a network you trust",
				errUsage, cfg.Listen, cfg.Listen, cfg.Root)
		case open:
			cfg.Log.Warn("INSECURE: this node listens on a non-loopback address without a token (--insecure): "+
				"anyone who reaches it can read and write every file under its root", "listen", cfg.Listen, "root", cfg.Root)
		}
	}
	var (
		mx         *metrics.Node
		metricsURL string
	)
	stopMetrics := func() {}
	if *metricsAddr != "" {
		if mx, metricsURL, stopMetrics, err = serveMetrics(*metricsAddr, cfg.Log); err != nil {
			return err
		}
		defer stopMetrics() // on the error paths; after the server, below
		cfg.Options = append(cfg.Options, rpc.WithObserver(mx))
	}
	// Listen before the services make their files: an address in use
	// fails the start with nothing made under the root.
	if cfg.Listener, err = net.Listen("tcp", cfg.Listen); err != nil {
		return fmt.Errorf("--listen %s: %w", cfg.Listen, err)
	}
	defer cfg.Listener.Close() // nodeproc.Run closes it too; again is harmless
	served, register, err := buffers.open(cfg.Root, cfg.Log)
	if err != nil {
		return err
	}
	openStores, registerStores, err := stores.open(cfg.Root, cfg.Log)
	if err != nil {
		return errors.Join(err, served.close())
	}
	defer openStores.close() // after the server: no call uses them
	producers, registerLoaders, err := loaders.open(cfg.Root, cfg.Log)
	if err != nil {
		return errors.Join(err, served.close())
	}
	storeNamed := func(name string) *store.Store {
		for i, spec := range stores {
			if spec.name == name {
				return openStores[i]
			}
		}
		return nil
	}
	running, serveHook, err := models.start(ctx, cfg.Root, storeNamed, cfg.Log)
	if err != nil {
		return errors.Join(err, served.close(), producers.close())
	}
	defer running.close() // after the server (deferred calls run after the return's)
	cfg.Register = func(s *rpc.Server) error {
		err := errors.Join(register(s), registerStores(s), registerLoaders(s), serveHook(s))
		if err == nil && mx != nil {
			mx.SetServer(s)
			for i, b := range served.bufs {
				mx.AddBuffer(served.names[i], b)
			}
			for i, spec := range stores {
				mx.AddStore(spec.name, openStores[i])
			}
			for i, p := range producers.producers {
				mx.AddLoader(producers.names[i], p)
			}
			for i, spec := range models {
				mx.AddModel(spec.name, running.stats(spec.name, i))
			}
		}
		return err
	}
	if *every > 0 && len(buffers) > 0 {
		cctx, stop := context.WithCancel(ctx)
		defer stop()
		go served.checkpointEvery(cctx, *every)
	}
	err = nodeproc.Run(ctx, cfg, func(addr string) {
		fmt.Fprintln(stdout, nodeproc.ListeningPrefix+addr)
		if *metricsAddr != "" {
			fmt.Fprintln(stdout, metricsPrefix+metricsURL)
		}
	})
	stopMetrics()                                              // before the objects it reads are closed
	return errors.Join(err, served.close(), producers.close()) // after the server: no call uses them
}

// reachableFromOthers reports whether listening on addr (HOST:PORT, as
// net.Listen takes it) may accept connections from other machines: true
// unless HOST resolves to a loopback address. An empty HOST, 0.0.0.0 and
// [::] listen on every interface.
func reachableFromOthers(addr string) (bool, error) {
	a, err := net.ResolveTCPAddr("tcp", addr) // the address net.Listen binds
	if err != nil {
		return false, err
	}
	return a.IP == nil || !a.IP.IsLoopback(), nil
}
