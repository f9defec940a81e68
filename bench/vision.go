package main

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/media"
	"github.com/tandem-inference/tandem/model/vision"
)

func init() {
	register(command{
		name:  "vision",
		short: "run the vision tower and projector on one image file and write its pixels and feature rows",
		run:   stages(parseVisionFlags, runVision),
	})
}

// visionConfig is bench vision's configuration, from its flags.
type visionConfig struct {
	model, image, pixelsOut, out string
	threads                      int
	stdout                       io.Writer
}

func parseVisionFlags(args []string) (visionConfig, error) {
	f := visionConfig{stdout: os.Stdout}
	fs := pflag.NewFlagSet("vision", pflag.ContinueOnError)
	fs.StringVar(&f.model, "model", "", "checkpoint `dir` (config.json with a vision_config, and the shards holding vision_tower.* and mm_projector.*)")
	fs.StringVar(&f.image, "image", "", "image `file`: PNG, JPEG, GIF (first frame) or WebP")
	fs.StringVar(&f.pixelsOut, "pixels-out", "", "write the preprocessed pixels to `file`: float32 little-endian [patches, 3, 14, 14], patches row-major")
	fs.StringVar(&f.out, "out", "", "write the projected feature rows to `file`: float32 little-endian [rows, hidden], rows row-major over the merged grid")
	fs.IntVar(&f.threads, "threads", 0, "CPU threads (0: all)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: bench vision --model DIR --image FILE [--pixels-out F] [--out F] [--threads N]

Decodes and preprocesses the image as Kimi K3's released processor does
(package media: EXIF orientation, the scale rule, bicubic resize, padding to
multiples of 28, normalisation), runs the vision tower (MoonViT-V2) and the
patchmergerv2 projector on the CPU backend, and prints the patch grid, the
number of feature rows (one per 2x2 group of patches: the image's prompt
positions) and the time the tower took. --pixels-out and --out write the
arrays, so that another implementation can be checked against them.

`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return f, err
	}
	if fs.NArg() > 0 {
		return f, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return f, nil
}

func (f visionConfig) validate() error {
	if f.model == "" || f.image == "" {
		return errors.New("need --model DIR and --image FILE (see bench vision --help)")
	}
	if f.threads < 0 {
		return fmt.Errorf("--threads %d: want 0 (all) or more", f.threads)
	}
	return nil
}

func runVision(ctx context.Context, f visionConfig) error {
	data, err := os.ReadFile(f.image)
	if err != nil {
		return err
	}
	im, err := media.Decode(data, media.DefaultLimits())
	if err != nil {
		return fmt.Errorf("%s: %w", f.image, err)
	}
	be := cpu.New(f.threads)
	tw, err := vision.Load(ctx, be, f.model)
	if err != nil {
		return err
	}
	defer tw.Close()
	c := tw.Config()
	fmt.Fprintf(f.stdout, "image %s: %dx%d, resized to %dx%d, padded grid %dx%d patches (%dx%d pixels), %d feature rows of width %d\n",
		f.image, im.Width, im.Height, im.ResizedW, im.ResizedH, im.GridW, im.GridH,
		im.GridW*media.PatchSize, im.GridH*media.PatchSize, im.Rows(), c.TextHidden)
	fmt.Fprintf(f.stdout, "pixels sha256 %s\n", hex.EncodeToString(im.Hash[:]))
	start := time.Now()
	feats, err := tw.Features(ctx, []vision.Patches{{GridH: im.GridH, GridW: im.GridW, Pixels: im.Pixels}})
	if err != nil {
		return err
	}
	took := time.Since(start)
	if len(feats[0]) != im.Rows()*c.TextHidden {
		return fmt.Errorf("the tower gave %d values, want %d rows of %d", len(feats[0]), im.Rows(), c.TextHidden)
	}
	fmt.Fprintf(f.stdout, "tower: %d blocks of width %d, projector to %d: %s on %d CPU threads\n",
		c.Layers, c.Hidden, c.TextHidden, took.Round(time.Millisecond), be.Threads())
	for _, o := range []struct {
		path string
		vals []float32
		what string
	}{{f.pixelsOut, im.Pixels, "pixels"}, {f.out, feats[0], "features"}} {
		if o.path == "" {
			continue
		}
		if err := writeFloats(o.path, o.vals); err != nil {
			return err
		}
		fmt.Fprintf(f.stdout, "wrote %s: %s (%d float32)\n", o.what, o.path, len(o.vals))
	}
	return nil
}

// writeFloats writes vals as float32 little-endian.
func writeFloats(path string, vals []float32) error {
	b := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return os.WriteFile(path, b, 0o644)
}
