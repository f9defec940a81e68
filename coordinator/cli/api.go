package cli

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/viper"
	"go.uber.org/zap"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/images"
	"github.com/tandem-inference/tandem/coordinator/modelinfo"
	"github.com/tandem-inference/tandem/coordinator/openai"
	"github.com/tandem-inference/tandem/internal/bytebudget"
	"github.com/tandem-inference/tandem/internal/config"
	"github.com/tandem-inference/tandem/tokenizer"
)

// httpSettings configure the OpenAI-compatible front door (serve and api).
var httpSettings = []setting{
	{Key: "http.listen", Default: "127.0.0.1:8000", Help: "OpenAI-compatible API address (empty: off); beyond loopback it requires http.api_keys"},
	{Key: "http.api_keys", Default: []string{}, Help: "bearer keys the API accepts (Authorization: Bearer KEY); none: no authentication, loopback only"},
	{Key: "http.model_name", Default: "", Help: "the model's name in the API (default: the model directory's name)"},
	{Key: "http.max_body_bytes", Bytes: true, Default: "16MiB", Help: "largest request body"},
	{Key: "http.body_timeout", Default: openai.DefaultBodyTimeout, Help: "time a request body has to arrive in full, from the end of its headers (later: 408); a body is read before the request takes a slot"},
	{Key: "http.max_prompt_tokens", Default: 0, Help: "longest prompt the API accepts, in tokens (0: the model's context length)"},
	{Key: "http.max_concurrent_per_key", Default: openai.DefaultMaxConcurrentPerKey, Help: "requests one API key may have in flight (without keys: all requests)"},
	{Key: "http.policy", Default: "", Help: "routing of the API's jobs: auto, local or remote (empty: the coordinator's router.policy)"},
	{Key: "http.images.fetch", Default: false, Help: "fetch the http(s) URLs of image_url parts (off: only data: URLs are read); only public addresses are ever dialled"},
	{Key: "http.images.fetch_allow", Default: []string{}, Help: "with http.images.fetch: the hosts images may come from (a name, or *.domain for it and its subdomains); none: any host"},
	{Key: "http.images.fetch_timeout", Default: images.DefaultFetchTimeout, Help: "with http.images.fetch: bound on one image's fetch, redirects and body included"},
	{Key: "http.images.fetch_max_bytes", Bytes: true, Default: "0", Help: "with http.images.fetch: largest image body fetched (0: images.bytes)"},
	// The image limits apply at the front door and at the coordinator's
	// admission (serve reads them for both).
	{Key: "images.per_request", Default: images.DefaultLimits().PerRequest, Help: "most images in one request or submission (more: 413 / too_large)"},
	{Key: "images.bytes", Bytes: true, Default: "5MiB", Help: "largest encoded image (PNG, JPEG, GIF, WebP)"},
	{Key: "images.total_bytes", Bytes: true, Default: "6MiB", Help: "largest total of a request's images; a job carries them in its NATS messages, so keep it under the server's max_payload (embedded.max_payload)"},
	{Key: "images.pixels", Default: images.DefaultLimits().Pixels, Help: "most pixels (width x height) of one image, read from its header before it is decoded"},
}

func apiCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "api",
		Short: "run the OpenAI-compatible HTTP API alone, in front of a deployment's NATS",
		Long: `Serve the OpenAI-compatible HTTP API (POST /v1/chat/completions,
POST /v1/completions, GET /v1/models, GET /health) for the deployment on
--nats-url. It keeps no job state: each request is an ordinary job, so
several can run behind a load balancer. It reads the model's config.json and
tokenizer (--model, the coordinator's model directory) to frame chats and
read replies. ` + "`coordinator serve`" + ` serves the same API itself.

` + settingsHelp(natsSettings, apiSettings, httpSettings),
		Args: cobra.NoArgs,
		RunE: runAPI,
	}
	addFlags(cmd.Flags(), natsSettings)
	addFlags(cmd.Flags(), apiSettings)
	addFlags(cmd.Flags(), httpSettings)
	return cmd
}

// apiSettings are the api command's own.
var apiSettings = []setting{
	{Key: "model", Default: "", Help: "model directory: its config.json and tokenizer files (the weights are not read)"},
}

func runAPI(cmd *cobra.Command, _ []string) error {
	v, err := resolve(cmd, natsSettings, apiSettings, httpSettings)
	if err != nil {
		return err
	}
	if v.GetString("http.listen") == "" {
		return fmt.Errorf("http.listen is empty: give the address to serve the API on")
	}
	if err := openai.CheckListen(v.GetString("http.listen"), v.GetStringSlice("http.api_keys")); err != nil {
		return err
	}
	log, err := newLogger(v, cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	info, tok, err := loadModel(v.GetString("model"))
	if err != nil {
		return err
	}
	o := natsOptions(v, "tandem-api", "", log)
	if o.URL == "" {
		o.URL = nats.DefaultURL
	}
	if err := apiIdentity(v, &o); err != nil {
		return err
	}
	o.MaxReconnects = -1 // a front door rides out NATS restarts
	nc, err := cp.Connect(cmd.Context(), o)
	if err != nil {
		return err
	}
	defer nc.Close()
	return serveAPI(cmd.Context(), v, nc, v.GetString("model"), info, tok, nil, log, nil)
}

// apiIdentity gives the API's connection a client's identity: the
// credentials in the settings, else this machine's client identity (as
// the client commands use), else the client name nats.client.
func apiIdentity(v *viper.Viper, o *cp.Options) error {
	o.UseLocalIdentity(cp.PrincipalClient)
	if o.HasAuth() {
		return nil
	}
	client := v.GetString("nats.client")
	if client == "" {
		client = cp.DefaultClient
	}
	if err := cp.CheckID(client); err != nil {
		return fmt.Errorf("nats.client: %w", err)
	}
	o.InboxPrefix = cp.InboxPrefix(cp.PrincipalClient, client)
	return nil
}

// apiConfig is the front door's configuration from the settings.
func apiConfig(v *viper.Viper, nc *nats.Conn, modelDir string, info *modelinfo.Info, tok *tokenizer.Tokenizer, log *zap.Logger) (openai.Config, error) {
	body, err := config.ParseBytes(v.GetString("http.max_body_bytes"))
	if err != nil {
		return openai.Config{}, fmt.Errorf("http.max_body_bytes: %w", err)
	}
	policy := cp.Policy(v.GetString("http.policy"))
	switch policy {
	case "", cp.PolicyAuto, cp.PolicyLocal, cp.PolicyRemote:
	default:
		return openai.Config{}, fmt.Errorf("http.policy %q: want auto, local or remote (or empty)", policy)
	}
	name := v.GetString("http.model_name")
	if name == "" {
		name = openai.ModelName(modelDir, info)
	}
	lim, err := imageLimits(v)
	if err != nil {
		return openai.Config{}, err
	}
	cfg := openai.Config{Conn: nc, Model: info, Tokenizer: tok, ModelName: name, APIKeys: v.GetStringSlice("http.api_keys"),
		MaxBodyBytes: body, MaxPromptTokens: v.GetInt("http.max_prompt_tokens"),
		MaxConcurrentPerKey: v.GetInt("http.max_concurrent_per_key"), BodyTimeout: v.GetDuration("http.body_timeout"),
		Images: lim, Policy: policy, Log: log.Named("api")}
	if v.GetBool("http.images.fetch") {
		maxBytes, err := config.ParseBytes(v.GetString("http.images.fetch_max_bytes"))
		if err != nil {
			return openai.Config{}, fmt.Errorf("http.images.fetch_max_bytes: %w", err)
		}
		cfg.ImageFetch = &images.FetchConfig{Allow: v.GetStringSlice("http.images.fetch_allow"),
			Timeout: v.GetDuration("http.images.fetch_timeout"), MaxBytes: maxBytes}
	}
	return cfg, nil
}

// imageLimits reads the images.* settings.
func imageLimits(v *viper.Viper) (images.Limits, error) {
	lim := images.Limits{PerRequest: v.GetInt("images.per_request"), Pixels: v.GetInt64("images.pixels")}
	for _, b := range []struct {
		key string
		to  *int64
	}{{"images.bytes", &lim.Bytes}, {"images.total_bytes", &lim.TotalBytes}} {
		if s := v.GetString(b.key); s != "" {
			n, err := config.ParseBytes(s)
			if err != nil {
				return lim, fmt.Errorf("%s: %w", b.key, err)
			}
			*b.to = n
		}
	}
	if lim.PerRequest < 0 || lim.Pixels < 0 {
		return lim, fmt.Errorf("images.per_request and images.pixels cannot be negative")
	}
	return lim.OrDefault(), nil
}

// serveAPI serves the front door until ctx ends; ready gets its address.
// budget, when not nil, is the coordinator's submission budget, shared
// with the request bodies.
func serveAPI(ctx context.Context, v *viper.Viper, nc *nats.Conn, modelDir string, info *modelinfo.Info, tok *tokenizer.Tokenizer,
	budget *bytebudget.Budget, log *zap.Logger, ready func(string)) error {
	cfg, err := apiConfig(v, nc, modelDir, info, tok, log)
	if err != nil {
		return err
	}
	cfg.Budget = budget
	srv, err := openai.New(cfg)
	if err != nil {
		return err
	}
	return srv.Serve(ctx, v.GetString("http.listen"), func(addr string) {
		log.Info("OpenAI-compatible API", zap.String("url", "http://"+addr+"/v1"), zap.String("model", cfg.ModelName),
			zap.Bool("api_keys", len(cfg.APIKeys) > 0))
		if ready != nil {
			ready(addr)
		}
	})
}
