package cli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	cp "github.com/tandem-inference/tandem/controlplane"
)

func credentialsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "credentials",
		Short: "create and list the NATS identities (coordinator, worker, clients); write a nats-server authorization block",
		Long: `Create the NATS identities of a deployment in a directory (default <user
config dir>/tandem/nats, the one the embedded server uses on loopback):
coordinator.json, worker.json and client.json (the client "local"), each a
JSON file {principal, name, user, password} with 0600 permissions. Files that
exist are kept. --add-client NAME adds a client with its own namespace
(client-NAME.json), --add-worker ID a worker identity limited to that worker
id (worker-ID.json).

Give each machine the file of its role: decode and prefill workers
--nats-credentials worker.json, clients --nats-credentials client.json. The
embedded server admits every identity in the directory. For a nats-server of
your own, --nats-server-conf FILE writes the authorization block with the
same permissions (include it in the server's configuration).

` + settingsHelp(credentialsSettings),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := resolve(cmd, credentialsSettings)
			if err != nil {
				return err
			}
			dir := v.GetString("dir")
			if dir == "" {
				d, err := cp.DefaultCredentialsDir()
				if err != nil {
					return err
				}
				dir = d
			}
			clients, workers := v.GetStringSlice("add_client"), v.GetStringSlice("add_worker")
			out := cmd.OutOrStdout()
			for _, add := range []struct {
				p     cp.Principal
				names []string
			}{{cp.PrincipalClient, clients}, {cp.PrincipalWorker, workers}} {
				for _, name := range add.names {
					path, err := cp.AddIdentity(dir, add.p, name)
					if err != nil {
						return err
					}
					fmt.Fprintf(out, "added %s %s: %s\n", add.p, name, path)
				}
			}
			ids, err := cp.EnsureCredentials(dir)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "identities in %s:\n", dir)
			for _, id := range ids {
				name := id.Name
				if name == "" {
					name = "-"
				}
				fmt.Fprintf(out, "  %-12s %-10s user %s\n", id.Principal, name, id.User)
			}
			if conf := v.GetString("nats_server_conf"); conf != "" {
				block, err := cp.ServerAuthorization(ids)
				if err != nil {
					return err
				}
				if err := os.WriteFile(conf, []byte(block), 0o600); err != nil {
					return fmt.Errorf("--nats-server-conf: %w", err)
				}
				// WriteFile keeps an existing file's mode: make it private.
				if err := os.Chmod(conf, 0o600); err != nil {
					return fmt.Errorf("--nats-server-conf: %w", err)
				}
				fmt.Fprintf(out, "nats-server authorization block: %s (include it in the server's configuration)\n", conf)
			}
			return nil
		},
	}
	addFlags(cmd.Flags(), credentialsSettings)
	return cmd
}

// credentialsSettings are the credentials command's.
var credentialsSettings = []setting{
	{Key: "dir", Default: "", Help: "credentials directory (default <user config dir>/tandem/nats)"},
	{Key: "add_client", Default: []string{}, Help: "add a client identity with this name (its namespace tandem.v1.clients.<name>)"},
	{Key: "add_worker", Default: []string{}, Help: "add a worker identity limited to this worker id"},
	{Key: "nats_server_conf", Default: "", Help: "write a nats-server authorization block for these identities to this file"},
}
