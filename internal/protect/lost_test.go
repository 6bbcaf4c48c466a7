package protect

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestLostByCloud(t *testing.T) {
	tests := []struct {
		name       string
		conditions []corev1.NodeCondition
		want       bool
	}{
		{"lifecycle controller lost it", []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: ReasonNodeStatusUnknown}}, true},
		{"kubelet says not ready", []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletNotReady"}}, false},
		{"not ready with the controller's reason", []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: ReasonNodeStatusUnknown}}, false},
		{"kubelet says unknown", []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "KubeletNotReady"}}, false},
		{"never posted status", []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusNeverUpdated"}}, false},
		{"unknown without a reason", []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown}}, false},
		{"ready", []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}}, false},
		{"no Ready condition", []corev1.NodeCondition{{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionUnknown, Reason: ReasonNodeStatusUnknown}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := &corev1.Node{Status: corev1.NodeStatus{Conditions: tt.conditions}}
			if got := LostByCloud(n); got != tt.want {
				t.Fatalf("LostByCloud = %v, want %v", got, tt.want)
			}
		})
	}
	if LostByCloud(nil) {
		t.Fatal("a nil node is lost")
	}
}
