package cli

import (
	"context"
	"errors"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/metrics"
	"github.com/tandem-inference/tandem/coordinator/openai"
	"github.com/tandem-inference/tandem/coordinator/service"
	"github.com/tandem-inference/tandem/internal/health"
)

func serveCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "run a coordinator (embedded NATS server unless --nats-url)",
		Long: `Run a coordinator until interrupted. Without --nats-url it starts an embedded
NATS server with JetStream (embedded.*), so that workers and clients connect
to it; with --nats-url it joins that deployment, and several coordinators can
share it.

The embedded server admits tandem's identities only (coordinator, worker,
client; see ` + "`coordinator credentials`" + `), each with its own subject
permissions. On loopback they are created on first start in <user config
dir>/tandem/nats, where the local workers and client commands find them.
Beyond loopback, embedded.credentials_dir must be set, or --insecure given. Jobs are kept in the durable queue: a job accepted is not lost
when the coordinator restarts.

On SIGINT/SIGTERM it stops taking jobs, hands the ones not yet assigned back
to the queue, and lets running ones finish for timeouts.shutdown_grace.

It also serves the OpenAI-compatible HTTP API on http.listen (default
127.0.0.1:8000; empty: off), each request an ordinary job; an address
beyond loopback requires http.api_keys. ` + "`coordinator api`" + ` serves the
same API alone, for more front doors.

` + settingsHelp(natsSettings, serveSettings, httpSettings),
		Args: cobra.NoArgs,
		RunE: runServe,
	}
	addFlags(cmd.Flags(), natsSettings)
	addFlags(cmd.Flags(), serveSettings)
	addFlags(cmd.Flags(), httpSettings)
	return cmd
}

func runServe(cmd *cobra.Command, _ []string) error {
	v, err := resolve(cmd, natsSettings, serveSettings, httpSettings)
	if err != nil {
		return err
	}
	mo, err := health.OptionsFrom(v.GetString, v.GetBool)
	if err != nil {
		return err
	}
	listen := v.GetString("http.listen")
	if listen != "" {
		// Refused before anything starts: no open API without keys.
		if err := openai.CheckListen(listen, v.GetStringSlice("http.api_keys")); err != nil {
			return err
		}
	}
	log, err := newLogger(v, cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	cfg, err := serviceConfig(v)
	if err != nil {
		return err
	}
	if cfg.Model, cfg.Tokenizer, err = loadModel(v.GetString("model")); err != nil {
		return err
	}
	cfg.Log = log
	cfg.Metrics = metrics.New()
	ctx := cmd.Context()

	url := ""
	var self *cp.Identity // the coordinator's identity on the embedded server
	var api *cp.Identity  // the API's (a client's) there
	if v.GetString("nats.url") == "" {
		sc, creds, err := serverConfig(v, log)
		if err != nil {
			return err
		}
		if sc, err = withIdentities(sc, creds, log); err != nil {
			return err
		}
		srv, err := cp.StartServer(ctx, sc)
		if err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := srv.Shutdown(sctx); err != nil {
				log.Warn("embedded NATS server shutdown", zap.Error(err))
			}
		}()
		url = srv.ClientURL()
		self = cp.Find(sc.Identities, cp.PrincipalCoordinator)
		api = cp.Find(sc.Identities, cp.PrincipalClient)
		log.Info("embedded NATS server", zap.String("url", url), zap.String("data_dir", srv.StoreDir()))
	}
	o := natsOptions(v, "tandem-coordinator", url, log)
	if self != nil {
		o.Identity = self
	} else if url == "" {
		o.UseLocalIdentity(cp.PrincipalCoordinator)
	}
	o.MaxReconnects = -1 // a coordinator rides out NATS restarts
	nc, err := cp.Connect(ctx, o)
	if err != nil {
		return err
	}
	defer nc.Close()
	co, err := service.New(nc, cfg)
	if err != nil {
		return err
	}
	if mo.Addr != "" {
		hs := health.New(cfg.Metrics.Registry())
		hs.Ready("nats", health.NATS(nc))
		hs.Ready("coordinator", func() error {
			select {
			case <-ctx.Done():
				return errors.New("shutting down")
			case <-co.Ready():
				return nil
			default:
				return errors.New("starting: opening the job queue, the registry and the results")
			}
		})
		if _, err := hs.Start(ctx, "metrics", mo, log); err != nil {
			return err
		}
	}
	if listen == "" {
		return co.Run(ctx)
	}
	// The API has its own connection, as a separate front door would.
	// The API submits as a client would, with a client's identity.
	ao := natsOptions(v, "tandem-api", url, log)
	if api != nil {
		ao.Identity = api
	} else if err := apiIdentity(v, &ao); err != nil {
		return err
	}
	ao.MaxReconnects = -1
	anc, err := cp.Connect(ctx, ao)
	if err != nil {
		return err
	}
	defer anc.Close()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var apiErr error
	apiDone := make(chan struct{})
	go func() {
		defer close(apiDone)
		if err := serveAPI(runCtx, v, anc, v.GetString("model"), cfg.Model, cfg.Tokenizer, co.Budget(), log, nil); err != nil && runCtx.Err() == nil {
			apiErr = err
			stop() // the coordinator does not run on without its API
		}
	}()
	err = co.Run(runCtx)
	stop()
	<-apiDone
	if apiErr != nil {
		return apiErr
	}
	return err
}
