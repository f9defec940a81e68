package router

// ShapeOf computes the state sizes of a K3-shaped model from its config
// numbers (K3-SPEC §4): MLA latent rows of (kvLora+rope) elements of
// latentBytes each per token per MLA layer; per KDA layer an fp32 state
// [H, D, D] and three fp32 conv tails [H·D, K-1]. lastIsMLA tells which kind
// the last layer is (K3's is MLA).
func ShapeOf(mlaLayers, kdaLayers, kvLora, rope, latentBytes, heads, headDim, convKernel int, lastIsMLA bool) Shape {
	row := float64((kvLora + rope) * latentBytes)
	kda := float64(heads*headDim*headDim*4 + 3*heads*headDim*(convKernel-1)*4)
	s := Shape{
		StateBytesPerToken: row * float64(mlaLayers),
		StateBytesFixed:    kda * float64(kdaLayers),
	}
	if lastIsMLA {
		s.LastLayerBytesPerToken = row
	} else {
		s.LastLayerBytesFixed = kda
	}
	return s
}
